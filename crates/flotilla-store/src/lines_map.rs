//! The in-memory state of a `lines` target (pure, no I/O): for every line, the descriptor
//! last made durable (`disk`) and what each slot holds now (`now`); the (fork, block) →
//! slot index; RAMA placement; and which descriptor entries a sync or a reorganization
//! commits.
//!
//! A slot may be allocated only when it is free both now and in the durable descriptor, so a
//! slot whose block was moved away or dropped (the *reclaimable* state) is never reused
//! before the descriptor that no longer names it is durable: after a crash no block can be
//! read from a slot another block has overwritten.

use crate::lines_format::{BlockState, Descriptor, Entry, ForkKey, Geometry};
use flotilla_types::{placement_hash, FileId};
use std::collections::{BTreeSet, HashMap};

/// Where a block lives: a line and a slot in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotAddr {
    pub line: u32,
    pub slot: u32,
}

/// What a slot holds now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotNow {
    Free,
    /// A fork's block; `written` is false while the slot is only reserved (reads give zeros
    /// and the descriptor does not name it yet); `clean` when a tertiary copy holds the same
    /// bytes (set by the migration manager or a recall, cleared by any write).
    Held {
        key: ForkKey,
        block: u64,
        written: bool,
        clean: bool,
        timestamp_s: u32,
    },
}

#[derive(Clone, Debug)]
struct Line {
    disk: Vec<Entry>,
    now: Vec<SlotNow>,
    sequence: u64,
}

/// The lines of a target.
#[derive(Clone, Debug)]
pub struct LineMap {
    geometry: Geometry,
    lines: Vec<Line>,
    index: HashMap<(ForkKey, u64), SlotAddr>,
    /// Dropped blocks whose durable descriptor still names their slot, so that a rewrite
    /// of the same block reuses that slot instead of leaving two durable names for it.
    ghosts: HashMap<(ForkKey, u64), SlotAddr>,
    /// Lines with entries of a fork not yet durable.
    pending: HashMap<ForkKey, BTreeSet<u32>>,
    reusable: u64,
    /// Bumped by every write or drop of a fork's blocks, so that the migration manager marks
    /// blocks clean only if nothing changed them since it read them.
    generations: HashMap<ForkKey, u64>,
}

/// A block that a tertiary copy also holds, durably marked so: a candidate for reclaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanBlock {
    pub addr: SlotAddr,
    pub key: ForkKey,
    pub block: u64,
    pub timestamp_s: u32,
}

/// How a target's slots are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCounts {
    pub dirty: u64,
    pub clean: u64,
    pub reusable: u64,
}

/// The line a fork's block group hashes to (RAMA Eq. 4-1).
pub fn home_line(geometry: &Geometry, key: ForkKey, block: u64) -> u32 {
    let identity = key.file ^ (u64::from(key.subfile) << 32 | u64::from(key.fork_tag)).rotate_left(17);
    let group = block / u64::from(geometry.group_blocks);
    (placement_hash(FileId(identity), group) % u64::from(geometry.line_count)) as u32
}

impl LineMap {
    /// The state after recovery from the chosen descriptors (one per line, in order).
    /// Returns the map and the blocks named twice (kept: the first; the other slot freed).
    pub fn recover(geometry: Geometry, descriptors: Vec<Descriptor>) -> (LineMap, u64) {
        let mut map = LineMap {
            geometry,
            lines: Vec::with_capacity(descriptors.len()),
            index: HashMap::new(),
            ghosts: HashMap::new(),
            pending: HashMap::new(),
            reusable: 0,
            generations: HashMap::new(),
        };
        let mut duplicates = 0;
        for descriptor in descriptors {
            let line = descriptor.line;
            let mut now = Vec::with_capacity(descriptor.entries.len());
            for (slot, entry) in descriptor.entries.iter().enumerate() {
                let addr = SlotAddr { line, slot: slot as u32 };
                let holds =
                    entry.state.holds_block() && map.index.insert((entry.key, entry.block), addr).is_none();
                if entry.state.holds_block() && !holds {
                    duplicates += 1;
                }
                now.push(match holds {
                    true => SlotNow::Held {
                        key: entry.key,
                        block: entry.block,
                        written: true,
                        clean: entry.state == BlockState::Clean,
                        timestamp_s: entry.timestamp_s,
                    },
                    false => {
                        map.reusable += 1;
                        SlotNow::Free
                    }
                });
            }
            let disk = descriptor
                .entries
                .iter()
                .zip(&now)
                .map(|(entry, now)| if matches!(now, SlotNow::Free) { Entry::FREE } else { *entry })
                .collect();
            map.lines.push(Line { disk, now, sequence: descriptor.sequence });
        }
        (map, duplicates)
    }

    /// A freshly formatted target: every slot free, every descriptor at sequence 1.
    pub fn formatted(geometry: Geometry) -> LineMap {
        let descriptors = (0..geometry.line_count)
            .map(|line| Descriptor {
                line,
                sequence: 1,
                entries: vec![Entry::FREE; geometry.line_blocks as usize],
            })
            .collect();
        LineMap::recover(geometry, descriptors).0
    }

    /// Slots that may be allocated now.
    pub fn reusable_slots(&self) -> u64 {
        self.reusable
    }

    /// Where a block is, if it has a slot.
    pub fn lookup(&self, key: ForkKey, block: u64) -> Option<SlotAddr> {
        self.index.get(&(key, block)).copied()
    }

    /// What a slot holds now.
    pub fn slot(&self, addr: SlotAddr) -> SlotNow {
        self.lines[addr.line as usize].now[addr.slot as usize]
    }

    /// Whether the block at `addr` has been written (false: reads give zeros).
    pub fn written(&self, addr: SlotAddr) -> bool {
        matches!(self.slot(addr), SlotNow::Held { written: true, .. })
    }

    fn is_reusable(&self, addr: SlotAddr) -> bool {
        let line = &self.lines[addr.line as usize];
        matches!(line.now[addr.slot as usize], SlotNow::Free)
            && !line.disk[addr.slot as usize].state.holds_block()
    }

    /// The slot of a block, allocating one (reserved, unwritten) if it has none; `None` when
    /// every line is full. Placement: the block's home line first, then the following lines
    /// in order (wrapping); in a line, next to the fork's neighbouring block if that slot is
    /// free, else at the start of a free run long enough for the rest of the block's group,
    /// else the first free slot.
    pub fn allocate(&mut self, key: ForkKey, block: u64, timestamp_s: u32) -> Option<SlotAddr> {
        if let Some(addr) = self.lookup(key, block) {
            return Some(addr);
        }
        let addr = match self.ghosts.remove(&(key, block)) {
            Some(addr) => addr,
            None => self.place(key, block)?,
        };
        if self.is_reusable(addr) {
            self.reusable -= 1;
        }
        self.lines[addr.line as usize].now[addr.slot as usize] =
            SlotNow::Held { key, block, written: false, clean: false, timestamp_s };
        self.index.insert((key, block), addr);
        self.pending.entry(key).or_default().insert(addr.line);
        Some(addr)
    }

    fn place(&self, key: ForkKey, block: u64) -> Option<SlotAddr> {
        if self.reusable == 0 {
            return None;
        }
        let home = home_line(&self.geometry, key, block);
        let count = self.geometry.line_count;
        (0..count).map(|step| (home + step) % count).find_map(|line| self.place_in_line(line, key, block))
    }

    fn place_in_line(&self, line: u32, key: ForkKey, block: u64) -> Option<SlotAddr> {
        let at = |slot: u32| SlotAddr { line, slot };
        let blocks = self.geometry.line_blocks;
        let neighbour = |other: u64, step: i64| {
            let addr = self.lookup(key, other)?;
            let slot = i64::from(addr.slot) + step;
            (addr.line == line && (0..i64::from(blocks)).contains(&slot) && self.is_reusable(at(slot as u32)))
                .then(|| at(slot as u32))
        };
        if let Some(addr) = block.checked_sub(1).and_then(|before| neighbour(before, 1)) {
            return Some(addr);
        }
        if let Some(addr) = neighbour(block + 1, -1) {
            return Some(addr);
        }
        let group = u64::from(self.geometry.group_blocks);
        let wanted = (group - block % group) as u32;
        let mut run_start = None;
        let mut first = None;
        for slot in 0..blocks {
            if !self.is_reusable(at(slot)) {
                run_start = None;
                continue;
            }
            first = first.or(Some(slot));
            let start = *run_start.get_or_insert(slot);
            if slot + 1 - start >= wanted {
                return Some(at(start));
            }
        }
        first.map(at)
    }

    /// Marks a reserved block as written (its data is on the medium).
    pub fn mark_written(&mut self, addr: SlotAddr, timestamp_s: u32) {
        if let SlotNow::Held { key, block, .. } = self.slot(addr) {
            self.lines[addr.line as usize].now[addr.slot as usize] =
                SlotNow::Held { key, block, written: true, clean: false, timestamp_s };
            self.pending.entry(key).or_default().insert(addr.line);
            *self.generations.entry(key).or_default() += 1;
        }
    }

    /// Marks reserved blocks written with bytes recalled from a tertiary copy: clean, and
    /// not a change (the generation stays, so a migration in flight still marks the fork
    /// clean).
    pub fn mark_recalled(&mut self, addrs: &[SlotAddr], timestamp_s: u32) {
        for addr in addrs {
            if let SlotNow::Held { key, block, .. } = self.slot(*addr) {
                self.lines[addr.line as usize].now[addr.slot as usize] =
                    SlotNow::Held { key, block, written: true, clean: true, timestamp_s };
                self.pending.entry(key).or_default().insert(addr.line);
            }
        }
    }

    /// How many times the fork's blocks were written or dropped (since the map was built).
    pub fn generation(&self, key: ForkKey) -> u64 {
        self.generations.get(&key).copied().unwrap_or(0)
    }

    /// Marks the fork's written blocks below `end_block` clean, each made `age_bias_s` older
    /// than it is (reclaim takes the oldest first; the migration manager ages the blocks of
    /// files it prefers not to keep, RAMA §4.2.3). Returns the lines changed; their
    /// descriptors are pending for the fork.
    pub fn mark_clean(&mut self, key: ForkKey, end_block: u64, age_bias_s: u32) -> Vec<u32> {
        let addrs: Vec<SlotAddr> = self
            .index
            .iter()
            .filter(|((owner, block), _)| *owner == key && *block < end_block)
            .map(|(_, addr)| *addr)
            .collect();
        let mut lines = BTreeSet::new();
        for addr in addrs {
            let now = &mut self.lines[addr.line as usize].now[addr.slot as usize];
            if let SlotNow::Held { key, block, written: true, timestamp_s, .. } = *now {
                let timestamp_s = timestamp_s.saturating_sub(age_bias_s);
                *now = SlotNow::Held { key, block, written: true, clean: true, timestamp_s };
                lines.insert(addr.line);
            }
        }
        if !lines.is_empty() {
            self.pending.entry(key).or_default().extend(lines.iter().copied());
        }
        lines.into_iter().collect()
    }

    /// The fork's blocks that have a slot: (block, written, clean), in block order.
    pub fn fork_blocks(&self, key: ForkKey) -> Vec<(u64, bool, bool)> {
        let mut blocks: Vec<(u64, bool, bool)> = self
            .index
            .iter()
            .filter(|((owner, _), _)| *owner == key)
            .map(|((_, block), addr)| match self.slot(*addr) {
                SlotNow::Held { written, clean, .. } => (*block, written, clean),
                SlotNow::Free => (*block, false, false),
            })
            .collect();
        blocks.sort_unstable();
        blocks
    }

    /// Blocks clean now and in their durable descriptor: what a reclaim may drop.
    pub fn clean_blocks(&self) -> Vec<CleanBlock> {
        let mut found = Vec::new();
        for (line, state) in self.lines.iter().enumerate() {
            for (slot, now) in state.now.iter().enumerate() {
                let SlotNow::Held { key, block, written: true, clean: true, timestamp_s } = *now else {
                    continue;
                };
                let durable = &state.disk[slot];
                if durable.state == BlockState::Clean && durable.key == key && durable.block == block {
                    let addr = SlotAddr { line: line as u32, slot: slot as u32 };
                    found.push(CleanBlock { addr, key, block, timestamp_s });
                }
            }
        }
        found
    }

    /// Drops a clean block (a reclaim): its slot is reusable once the descriptor that says so
    /// is durable; until then a read of the block misses and is recalled.
    pub fn reclaim(&mut self, victim: &CleanBlock) -> bool {
        let held = matches!(
            self.slot(victim.addr),
            SlotNow::Held { key, block, clean: true, .. } if key == victim.key && block == victim.block
        );
        if held {
            self.free_slot(victim.key, victim.block, victim.addr);
        }
        held
    }

    /// Dirty, clean and reusable slots.
    pub fn counts(&self) -> SlotCounts {
        let mut counts = SlotCounts { reusable: self.reusable, ..SlotCounts::default() };
        for state in &self.lines {
            for now in &state.now {
                match now {
                    SlotNow::Held { written: true, clean: true, .. } => counts.clean += 1,
                    SlotNow::Held { written: true, clean: false, .. } => counts.dirty += 1,
                    _ => {}
                }
            }
        }
        counts
    }

    /// Forks with written blocks not yet clean, with the newest of those blocks' timestamps
    /// (the migration manager's candidates), in key order.
    pub fn dirty_forks(&self) -> Vec<(ForkKey, u32)> {
        let mut newest: HashMap<ForkKey, u32> = HashMap::new();
        for state in &self.lines {
            for now in &state.now {
                if let SlotNow::Held { key, written: true, clean: false, timestamp_s, .. } = *now {
                    let stamp = newest.entry(key).or_default();
                    *stamp = (*stamp).max(timestamp_s);
                }
            }
        }
        let mut forks: Vec<(ForkKey, u32)> = newest.into_iter().collect();
        forks.sort_unstable();
        forks
    }

    /// Drops a fork's blocks from `first_block` on; returns how many were dropped.
    pub fn drop_from(&mut self, key: ForkKey, first_block: u64) -> u64 {
        let doomed: Vec<(u64, SlotAddr)> = self
            .index
            .iter()
            .filter(|((owner, block), _)| *owner == key && *block >= first_block)
            .map(|((_, block), addr)| (*block, *addr))
            .collect();
        for (block, addr) in &doomed {
            self.free_slot(key, *block, *addr);
        }
        *self.generations.entry(key).or_default() += 1;
        doomed.len() as u64
    }

    fn free_slot(&mut self, key: ForkKey, block: u64, addr: SlotAddr) {
        self.index.remove(&(key, block));
        let line = &mut self.lines[addr.line as usize];
        line.now[addr.slot as usize] = SlotNow::Free;
        let durable = line.disk[addr.slot as usize];
        if durable.state.holds_block() {
            if durable.key == key && durable.block == block {
                self.ghosts.insert((key, block), addr);
            }
        } else {
            self.reusable += 1;
        }
        self.pending.entry(key).or_default().insert(addr.line);
    }

    /// The lines with entries of `key` not yet durable.
    pub fn pending_lines(&self, key: ForkKey) -> Vec<u32> {
        self.pending.get(&key).map(|lines| lines.iter().copied().collect()).unwrap_or_default()
    }

    /// Every line with entries not yet durable, and the forks they belong to.
    pub fn all_pending(&self) -> Vec<(ForkKey, u32)> {
        let mut pending: Vec<(ForkKey, u32)> =
            self.pending.iter().flat_map(|(key, lines)| lines.iter().map(|line| (*key, *line))).collect();
        pending.sort();
        pending
    }

    /// The descriptor that commits, in `line`, every slot whose entry (now or durable)
    /// belongs to `key`, leaving other forks' entries as they are durably. Sequence: next.
    pub fn commit_for(&self, line: u32, key: ForkKey) -> Descriptor {
        let state = &self.lines[line as usize];
        let slots: Vec<u32> = (0..self.geometry.line_blocks)
            .filter(|slot| {
                let durable = &state.disk[*slot as usize];
                let now_owner =
                    matches!(state.now[*slot as usize], SlotNow::Held { key: owner, .. } if owner == key);
                now_owner || (durable.state.holds_block() && durable.key == key)
            })
            .collect();
        self.commit_slots(line, &slots)
    }

    /// The descriptor that commits the given slots of `line` as they are now.
    pub fn commit_slots(&self, line: u32, slots: &[u32]) -> Descriptor {
        let state = &self.lines[line as usize];
        let mut entries = state.disk.clone();
        for slot in slots {
            let slot = *slot as usize;
            entries[slot] = match state.now[slot] {
                SlotNow::Held { key, block, written: true, clean, timestamp_s } => {
                    let state = if clean { BlockState::Clean } else { BlockState::Dirty };
                    Entry { key, block, timestamp_s, state }
                }
                SlotNow::Held { written: false, .. } => Entry::FREE,
                SlotNow::Free if state.disk[slot].state.holds_block() => {
                    Entry { state: BlockState::Reclaimable, ..state.disk[slot] }
                }
                SlotNow::Free => Entry::FREE,
            };
        }
        Descriptor { line, sequence: state.sequence + 1, entries }
    }

    /// Which copy (0 = A, 1 = B) the next descriptor write of `line` goes to: never the one
    /// holding the durable descriptor.
    pub fn next_copy(&self, line: u32) -> u8 {
        ((self.lines[line as usize].sequence + 1) % 2) as u8
    }

    /// Records that `descriptor` is durable: slots it no longer names become reusable.
    pub fn committed(&mut self, descriptor: Descriptor, key: Option<ForkKey>) {
        let line = descriptor.line;
        let state = &mut self.lines[line as usize];
        for (slot, entry) in descriptor.entries.iter().enumerate() {
            let was = state.disk[slot];
            if was.state.holds_block() && !entry.state.holds_block() {
                self.ghosts.retain(|_, addr| *addr != SlotAddr { line, slot: slot as u32 });
                if matches!(state.now[slot], SlotNow::Free) {
                    self.reusable += 1;
                }
            }
        }
        state.disk = descriptor
            .entries
            .into_iter()
            .map(|entry| if entry.state.holds_block() { entry } else { Entry::FREE })
            .collect();
        state.sequence = descriptor.sequence;
        if let Some(key) = key {
            let done = self.pending.get_mut(&key).map(|lines| {
                lines.remove(&line);
                lines.is_empty()
            });
            if done == Some(true) {
                self.pending.remove(&key);
            }
        }
    }

    /// A move that makes a fork's blocks in some line contiguous and in order (§4.2): the
    /// fork's durable, written blocks in that line, each with its new slot, all in one line
    /// so that one descriptor write commits the whole move. `None` if no line needs one (or
    /// none has a free run long enough).
    pub fn plan_reorganization(&self) -> Option<(u32, Vec<(SlotAddr, SlotAddr)>)> {
        (0..self.geometry.line_count).find_map(|line| self.plan_line(line))
    }

    fn plan_line(&self, line: u32) -> Option<(u32, Vec<(SlotAddr, SlotAddr)>)> {
        let state = &self.lines[line as usize];
        let mut forks: HashMap<ForkKey, Vec<(u64, u32)>> = HashMap::new();
        for (slot, now) in state.now.iter().enumerate() {
            if let SlotNow::Held { key, block, written: true, .. } = now {
                let durable = &state.disk[slot];
                if durable.state.holds_block() && durable.key == *key && durable.block == *block {
                    forks.entry(*key).or_default().push((*block, slot as u32));
                }
            }
        }
        let mut keys: Vec<&ForkKey> = forks.keys().collect();
        keys.sort();
        for key in keys {
            let mut blocks = forks[key].clone();
            blocks.sort();
            if blocks.len() < 2 || contiguous(&blocks) || self.pending.contains_key(key) {
                continue;
            }
            let Some(start) = self.free_run(line, blocks.len() as u32) else { continue };
            let moves = blocks
                .iter()
                .enumerate()
                .map(|(at, (_, slot))| {
                    (SlotAddr { line, slot: *slot }, SlotAddr { line, slot: start + at as u32 })
                })
                .collect();
            return Some((line, moves));
        }
        None
    }

    fn free_run(&self, line: u32, length: u32) -> Option<u32> {
        let mut start = 0;
        for slot in 0..self.geometry.line_blocks {
            if !self.is_reusable(SlotAddr { line, slot }) {
                start = slot + 1;
            } else if slot + 1 - start >= length {
                return Some(start);
            }
        }
        None
    }

    /// Applies a planned move in memory (the data has been copied): each block now lives in
    /// its new slot, and its old slot is reclaimable until `commit_slots` of both is durable.
    pub fn apply_move(&mut self, moves: &[(SlotAddr, SlotAddr)]) {
        for (from, to) in moves {
            let now = self.slot(*from);
            let SlotNow::Held { key, block, .. } = now else { continue };
            self.lines[from.line as usize].now[from.slot as usize] = SlotNow::Free;
            self.lines[to.line as usize].now[to.slot as usize] = now;
            self.reusable -= 1;
            self.index.insert((key, block), *to);
        }
    }

    /// Every slot's durable entry and current state, for checks in tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut reusable = 0;
        for (line, state) in self.lines.iter().enumerate() {
            for (slot, now) in state.now.iter().enumerate() {
                let addr = SlotAddr { line: line as u32, slot: slot as u32 };
                if self.is_reusable(addr) {
                    reusable += 1;
                }
                if let SlotNow::Held { key, block, .. } = now {
                    assert_eq!(self.lookup(*key, *block), Some(addr));
                }
            }
        }
        assert_eq!(reusable, self.reusable);
    }
}

/// Whether blocks (sorted by block number) sit in consecutive ascending slots (gaps in the
/// block numbers, e.g. two groups of a fork in one line, need no gap in the slots).
fn contiguous(blocks: &[(u64, u32)]) -> bool {
    blocks.windows(2).all(|pair| pair[1].1 == pair[0].1 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn geometry() -> Geometry {
        Geometry { block_bytes: 4096, line_blocks: 16, line_count: 8, group_blocks: 4 }
    }

    /// Finds a block from its durable descriptors alone, by RAMA's probe sequence.
    fn probe(map: &LineMap, key: ForkKey, block: u64) -> Option<SlotAddr> {
        let geometry = map.geometry;
        let home = home_line(&geometry, key, block);
        (0..geometry.line_count).map(|step| (home + step) % geometry.line_count).find_map(|line| {
            map.lines[line as usize]
                .disk
                .iter()
                .position(|entry| entry.state.holds_block() && entry.key == key && entry.block == block)
                .map(|slot| SlotAddr { line, slot: slot as u32 })
        })
    }

    fn commit_all(map: &mut LineMap, keys: &[ForkKey]) {
        for key in keys {
            for line in map.pending_lines(*key) {
                let descriptor = map.commit_for(line, *key);
                map.committed(descriptor, Some(*key));
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write(usize, u64),
        Drop(usize, u64),
        Commit,
        Reorganize,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..3, 0u64..40).prop_map(|(fork, block)| Op::Write(fork, block)),
            1 => (0usize..3, 0u64..40).prop_map(|(fork, block)| Op::Drop(fork, block)),
            2 => Just(Op::Commit),
            1 => Just(Op::Reorganize),
        ]
    }

    proptest! {
        #[test]
        fn every_block_is_found_from_fork_and_block_alone(ops in prop::collection::vec(op(), 1..200)) {
            let keys = [ForkKey::new(1, 0, "data"), ForkKey::new(1, 1, "data"), ForkKey::new(2, 0, "index")];
            let mut map = LineMap::formatted(geometry());
            let mut live: BTreeSet<(usize, u64)> = BTreeSet::new();
            for op in &ops {
                match op {
                    Op::Write(fork, block) => {
                        if let Some(addr) = map.allocate(keys[*fork], *block, 1) {
                            map.mark_written(addr, 1);
                            live.insert((*fork, *block));
                        } else {
                            prop_assert_eq!(map.reusable_slots(), 0);
                        }
                    }
                    Op::Drop(fork, block) => {
                        map.drop_from(keys[*fork], *block);
                        live.retain(|(owner, at)| owner != fork || at < block);
                    }
                    Op::Commit => commit_all(&mut map, &keys),
                    Op::Reorganize => {
                        if let Some((line, moves)) = map.plan_reorganization() {
                            map.apply_move(&moves);
                            let slots: Vec<u32> = moves.iter().flat_map(|(a, b)| [a.slot, b.slot]).collect();
                            let descriptor = map.commit_slots(line, &slots);
                            map.committed(descriptor, None);
                            prop_assert!(map.plan_line(line).is_none_or(|(_, next)| next != moves), "a move repeats");
                        }
                    }
                }
                map.check();
            }
            commit_all(&mut map, &keys);
            for (fork, block) in &live {
                let found = probe(&map, keys[*fork], *block);
                prop_assert!(found.is_some(), "block {} of fork {} not found by probing", block, fork);
                prop_assert_eq!(found, map.lookup(keys[*fork], *block));
            }
            // Recovery from the durable descriptors alone gives the same index.
            let descriptors = (0..map.geometry.line_count)
                .map(|line| Descriptor { line, sequence: map.lines[line as usize].sequence, entries: map.lines[line as usize].disk.clone() })
                .collect();
            let (recovered, duplicates) = LineMap::recover(map.geometry, descriptors);
            prop_assert_eq!(duplicates, 0);
            prop_assert_eq!(&recovered.index, &map.index);
            prop_assert_eq!(recovered.reusable_slots(), map.reusable_slots());
        }
    }

    #[test]
    fn a_dropped_slot_is_not_reused_before_its_descriptor_is_durable() {
        let geometry = Geometry { block_bytes: 4096, line_blocks: 2, line_count: 1, group_blocks: 1 };
        let mut map = LineMap::formatted(geometry);
        let (a, b) = (ForkKey::new(1, 0, "data"), ForkKey::new(2, 0, "data"));
        for block in 0..2 {
            let addr = map.allocate(a, block, 1).unwrap();
            map.mark_written(addr, 1);
        }
        commit_all(&mut map, &[a]);
        map.drop_from(a, 0);
        assert_eq!(map.allocate(b, 0, 1), None, "reclaimable slots must not be handed out");
        // The same block of the same fork may come back to its own slot.
        assert!(map.allocate(a, 1, 1).is_some());
        commit_all(&mut map, &[a]);
        assert!(map.allocate(b, 0, 1).is_some());
        assert_eq!(map.allocate(b, 1, 1), None);
    }

    #[test]
    fn a_group_lands_contiguously_in_its_home_line() {
        let mut map = LineMap::formatted(geometry());
        let key = ForkKey::new(9, 0, "data");
        let addrs: Vec<SlotAddr> = (0..4).map(|block| map.allocate(key, block, 1).unwrap()).collect();
        assert_eq!(addrs[0].line, home_line(&geometry(), key, 0));
        for pair in addrs.windows(2) {
            assert_eq!((pair[1].line, pair[1].slot), (pair[0].line, pair[0].slot + 1));
        }
    }
}
