//! The buffer cache's index and replacement state (Galley's CacheManager).
//!
//! Blocks are keyed by (fork serial, block number); a fork serial stands for (target, file,
//! subfile, fork name) and is never reused, see `fork`. The bytes live in the `SlotPool`;
//! this type decides which slot holds which block.
//!
//! Lists (all O(1) per operation, intrusive over slot numbers):
//! - `free`: slots holding no block.
//! - `clean_lru`: slots holding a clean, unpinned, ready block, most recently used at the
//!   front. Eviction takes the back. Together with `dirty_fifo` this is the global LRU;
//!   dirty blocks are not evictable until written back.
//! - `dirty_fifo`: dirty slots in the order they became dirty (for `flush_aged` and for
//!   write-back under memory pressure).
//!
//! Bulk gates (`begin_bulk`, issue 12 "one cache, not two"): a bulk request moves whole
//! blocks straight between its buffer and the fork file. For its time it holds a gate over
//! its blocks: no request maps a missing block inside a gate (it waits, as for room), and a
//! gate waits for every overlapping gate unless both only read. So while a bulk write runs
//! none of its blocks is cached, loaded or written back, and a bulk read never meets a write
//! of the same blocks between its data and their checksums.
//!
//! Invariants (checked by `check_invariants` in tests):
//! - `index` maps exactly the keys of mapped slots; a key maps to at most one slot.
//! - A slot with `refs > 0` is never evicted or reassigned; a request holds a pin on every
//!   block of its window, a write-back holds one until the disk wrote the block.
//! - A slot is in `clean_lru` iff it is mapped, unpinned and clean; in `dirty_fifo` iff
//!   dirty; in `free` iff unmapped. `dirty_blocks` is the length of `dirty_fifo`.
//! - Pinning is all-or-nothing per window: if the free and clean slots cannot take all of a
//!   window's misses, nothing is pinned and the caller writes back dirty blocks or waits
//!   for unpins holding no pins itself, so requests cannot deadlock on each other.
//! - The writer of a block marks it dirty after copying into it; a flusher clears the dirty
//!   flag before the disk reads the bytes. Either order of a racing copy and write-back
//!   therefore leaves the newest bytes on disk or the block dirty.

use crate::fork::Fork;
use crate::lru_list::LruList;
use crate::slot_pool::SlotPool;
use crate::stats::{bump, Counters};
use crate::window::{BlockAction, Window};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

const UNPINNED_SLOT: u32 = u32::MAX;
/// Under memory pressure, write back at least this many dirty blocks at once, so the disk
/// scheduler gets runs to coalesce instead of single blocks.
const PRESSURE_WRITEBACK_BLOCKS_MIN: usize = 32;

/// A cached block's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BlockKey {
    pub fork_serial: u64,
    pub block: u64,
}

/// A dirty block pinned for write-back.
#[derive(Debug)]
pub(crate) struct WritebackItem {
    pub fork: Arc<Fork>,
    pub block: u64,
    pub slot: u32,
}

/// Where a block goes in the LRU once its write-back is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Written back to make room: first to be evicted.
    Cold,
    /// Written back by sync or age: keeps being cached.
    Hot,
}

/// Result of trying to pin a window.
#[derive(Debug)]
pub(crate) enum PinOutcome {
    /// Every block is pinned and `slot`/`action` are set.
    Pinned,
    /// Not enough room: write these back (they are pinned), then try again.
    WriteBack(Vec<WritebackItem>),
    /// Not enough room and nothing to write back; waited for an unpin, try again.
    Retry,
}

#[derive(Debug)]
struct SlotMeta {
    mapping: Option<(BlockKey, Arc<Fork>)>,
    refs: u32,
    dirty: bool,
    dirty_since: Instant,
}

#[derive(Debug)]
struct CacheState {
    index: HashMap<BlockKey, u32>,
    metas: Vec<SlotMeta>,
    free: Vec<u32>,
    clean_lru: LruList,
    dirty_fifo: LruList,
    /// Bulk requests in flight (a handful at most: one per worker thread).
    gates: Vec<Gate>,
    next_gate: u64,
}

/// Blocks `first..end` of a fork that a bulk request moves around the cache.
#[derive(Clone, Copy, Debug)]
struct Gate {
    id: u64,
    fork_serial: u64,
    first: u64,
    end: u64,
    write: bool,
}

impl Gate {
    fn covers(&self, fork_serial: u64, block: u64) -> bool {
        self.fork_serial == fork_serial && (self.first..self.end).contains(&block)
    }

    fn conflicts(&self, fork_serial: u64, first: u64, end: u64, write: bool) -> bool {
        self.fork_serial == fork_serial && first < self.end && self.first < end && (write || self.write)
    }
}

/// A run of a bulk request's blocks: moved straight to or from the fork file (`direct`), or
/// through the cache because the cache holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BulkRun {
    pub first: u64,
    pub end: u64,
    pub direct: bool,
}

/// A bulk request's gate; dropping it lets requests waiting for its blocks go on.
#[derive(Debug)]
pub(crate) struct BulkGate<'a> {
    cache: &'a BlockCache,
    id: u64,
}

impl Drop for BulkGate<'_> {
    fn drop(&mut self) {
        let mut state = self.cache.state.lock();
        state.gates.retain(|gate| gate.id != self.id);
        drop(state);
        self.cache.unpinned.notify_all();
    }
}

/// Index and replacement policy of the buffer cache.
#[derive(Debug)]
pub(crate) struct BlockCache {
    pool: Arc<SlotPool>,
    state: Mutex<CacheState>,
    unpinned: Condvar,
    counters: Arc<Counters>,
    block_shift: u32,
}

impl BlockCache {
    pub(crate) fn new(pool: Arc<SlotPool>, counters: Arc<Counters>) -> Self {
        let count = pool.count();
        let now = Instant::now();
        let metas =
            (0..count).map(|_| SlotMeta { mapping: None, refs: 0, dirty: false, dirty_since: now }).collect();
        let state = CacheState {
            index: HashMap::with_capacity(count),
            metas,
            free: (0..count as u32).rev().collect(),
            clean_lru: LruList::new(count),
            dirty_fifo: LruList::new(count),
            gates: Vec::new(),
            next_gate: 1,
        };
        Self {
            block_shift: pool.block_bytes().trailing_zeros(),
            pool,
            state: Mutex::new(state),
            unpinned: Condvar::new(),
            counters,
        }
    }

    pub(crate) fn pool(&self) -> &Arc<SlotPool> {
        &self.pool
    }

    /// Bytes of dirty blocks.
    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.state.lock().dirty_fifo.len() as u64 * self.pool.block_bytes() as u64
    }

    /// Bytes of blocks holding data.
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.state.lock().index.len() as u64 * self.pool.block_bytes() as u64
    }

    /// Pins every block of the window, or pins nothing and says what to do first.
    pub(crate) fn try_pin(&self, fork: &Arc<Fork>, window: &mut Window, writing: bool) -> PinOutcome {
        let mut state = self.state.lock();
        // Read under the lock: a writer raises the size before it unpins (under this lock),
        // so a block written, written back and evicted since is not mistaken for a hole.
        let size_bytes = fork.size_bytes();
        let (misses, clean_hits) = state.look_up(fork.serial(), window);
        if misses > 0 && state.misses_gated(fork.serial(), window) {
            // A bulk request is moving some of these blocks around the cache; wait for it.
            self.unpinned.wait(&mut state);
            return PinOutcome::Retry;
        }
        let available = state.free.len() + state.clean_lru.len() - clean_hits;
        if misses > available {
            let wanted = (misses - available).max(PRESSURE_WRITEBACK_BLOCKS_MIN);
            let batch = state.take_dirty_unpinned(wanted);
            if batch.is_empty() {
                self.unpinned.wait(&mut state);
                return PinOutcome::Retry;
            }
            return PinOutcome::WriteBack(batch);
        }
        self.pin_found_and_missing(state, fork, window, (size_bytes, misses), writing);
        PinOutcome::Pinned
    }

    /// Pins the window's cached blocks and gives its misses slots (the caller checked the
    /// room), then unlocks and counts hits and misses.
    fn pin_found_and_missing(
        &self,
        mut state: parking_lot::MutexGuard<'_, CacheState>,
        fork: &Arc<Fork>,
        window: &mut Window,
        (size_bytes, misses): (u64, usize),
        writing: bool,
    ) {
        for entry in window.blocks.iter_mut().filter(|entry| entry.slot != UNPINNED_SLOT) {
            state.pin(entry.slot);
            entry.action = BlockAction::Hit;
        }
        let evicted = self.assign_misses(&mut state, fork, window, size_bytes, writing);
        drop(state);
        drop(evicted);
        bump(&self.counters.cache_hits, (window.blocks.len() - misses) as u64);
        bump(&self.counters.cache_misses, misses as u64);
    }

    /// `try_pin` that never waits and never asks for a write-back (a prefetch): pins every
    /// block of the window and returns true, or pins nothing and returns false when the
    /// free and clean slots cannot take its misses or a bulk gate covers one of them.
    pub(crate) fn pin_if_room(&self, fork: &Arc<Fork>, window: &mut Window, writing: bool) -> bool {
        let state = self.state.lock();
        let size_bytes = fork.size_bytes();
        let (misses, clean_hits) = state.look_up(fork.serial(), window);
        let available = state.free.len() + state.clean_lru.len() - clean_hits;
        if misses > available || (misses > 0 && state.misses_gated(fork.serial(), window)) {
            return false;
        }
        self.pin_found_and_missing(state, fork, window, (size_bytes, misses), writing);
        true
    }

    /// Gives every missing block of the window a slot, pinned and loading, and decides how
    /// it is loaded. Returns the forks of evicted blocks, to be dropped after unlocking.
    fn assign_misses(
        &self,
        state: &mut CacheState,
        fork: &Arc<Fork>,
        window: &mut Window,
        size_bytes: u64,
        writing: bool,
    ) -> Vec<Arc<Fork>> {
        let mut evicted = Vec::new();
        for position in 0..window.blocks.len() {
            if window.blocks[position].slot != UNPINNED_SLOT {
                continue;
            }
            let block = window.blocks[position].block;
            let beyond_end = block << self.block_shift >= size_bytes;
            let zero = beyond_end || (writing && window.fully_covered(position));
            let slot = state.take_slot(&mut evicted, &self.counters);
            let key = BlockKey { fork_serial: fork.serial(), block };
            state.assign(slot, key, fork);
            self.pool.begin_loading(slot);
            let entry = &mut window.blocks[position];
            entry.slot = slot;
            entry.action = if zero { BlockAction::Zero } else { BlockAction::Read };
        }
        evicted
    }

    /// Starts a bulk request over blocks `first..end` of a fork: waits out conflicting bulk
    /// requests, then splits the range into runs. A block the cache holds stays on the cache
    /// path, except that a bulk write drops every such block nobody has pinned (clean or
    /// dirty: the write replaces all of its bytes). Every other block is `direct`, and the
    /// returned gate keeps the cache from taking it up until the gate is dropped. The caller
    /// holds no pins; it must drop the gate before it sends runs through the cache path.
    pub(crate) fn begin_bulk(
        &self,
        fork_serial: u64,
        first: u64,
        end: u64,
        write: bool,
    ) -> (Vec<BulkRun>, BulkGate<'_>) {
        let mut state = self.state.lock();
        while state.gates.iter().any(|gate| gate.conflicts(fork_serial, first, end, write)) {
            self.unpinned.wait(&mut state);
        }
        let mut runs: Vec<BulkRun> = Vec::new();
        let mut dropped = Vec::new();
        for block in first..end {
            let direct = match state.index.get(&BlockKey { fork_serial, block }).copied() {
                None => true,
                Some(slot) if write && state.metas[slot as usize].refs == 0 => {
                    state.unmap(slot, &mut dropped);
                    true
                }
                Some(_) => false,
            };
            match runs.last_mut() {
                Some(run) if run.direct == direct => run.end = block + 1,
                _ => runs.push(BulkRun { first: block, end: block + 1, direct }),
            }
        }
        let id = state.next_gate;
        state.next_gate += 1;
        state.gates.push(Gate { id, fork_serial, first, end, write });
        drop(state);
        drop(dropped);
        (runs, BulkGate { cache: self, id })
    }

    /// Unpins every block of the window; blocks a writer touched become dirty first.
    pub(crate) fn unpin_window(&self, window: &mut Window) {
        let now = Instant::now();
        let mut released = false;
        let mut dropped = Vec::new();
        let mut state = self.state.lock();
        for entry in window.blocks.iter_mut().filter(|entry| entry.slot != UNPINNED_SLOT) {
            if entry.touched {
                state.mark_dirty(entry.slot, now);
            }
            released |= state.unpin(entry.slot, &self.pool, &mut dropped, Placement::Hot);
            entry.slot = UNPINNED_SLOT;
        }
        drop(state);
        if released {
            self.unpinned.notify_all();
        }
    }

    /// Pins dirty blocks for write-back: those of one fork (`Some(serial)`) or all.
    pub(crate) fn take_dirty(&self, fork_serial: Option<u64>) -> Vec<WritebackItem> {
        let mut state = self.state.lock();
        let slots = state.dirty_slots(|meta| match (fork_serial, &meta.mapping) {
            (None, _) => true,
            (Some(serial), Some((key, _))) => key.fork_serial == serial,
            (Some(_), None) => false,
        });
        slots.into_iter().map(|slot| state.take_for_writeback(slot)).collect()
    }

    /// Pins for write-back those of `blocks` of fork `fork_serial` that are cached and dirty
    /// (the WriteFull policy).
    pub(crate) fn take_dirty_blocks(&self, fork_serial: u64, blocks: &[u64]) -> Vec<WritebackItem> {
        let mut state = self.state.lock();
        let mut items = Vec::new();
        for &block in blocks {
            let Some(&slot) = state.index.get(&BlockKey { fork_serial, block }) else { continue };
            if state.metas[slot as usize].dirty {
                items.push(state.take_for_writeback(slot));
            }
        }
        items
    }

    /// Pins for write-back the blocks dirty since `cutoff` or earlier (none if `None`), and,
    /// while more than `dirty_bytes_high_max` are dirty, the oldest ones until at most half
    /// of it are.
    pub(crate) fn take_dirty_aged(
        &self,
        cutoff: Option<Instant>,
        dirty_bytes_high_max: u64,
    ) -> Vec<WritebackItem> {
        let block_bytes = self.pool.block_bytes() as u64;
        let mut state = self.state.lock();
        let dirty_bytes = state.dirty_fifo.len() as u64 * block_bytes;
        let excess_bytes = match dirty_bytes > dirty_bytes_high_max {
            true => dirty_bytes - dirty_bytes_high_max / 2,
            false => 0,
        };
        let mut excess_blocks = excess_bytes.div_ceil(block_bytes);
        let mut items = Vec::new();
        while let Some(slot) = state.dirty_fifo.front() {
            let since = state.metas[slot as usize].dirty_since;
            let aged = matches!(cutoff, Some(cutoff) if since <= cutoff);
            if excess_blocks == 0 && !aged {
                break;
            }
            excess_blocks = excess_blocks.saturating_sub(1);
            items.push(state.take_for_writeback(slot));
        }
        items
    }

    /// Ends a write-back: unpins, and on failure marks the blocks dirty again.
    pub(crate) fn finish_writeback(&self, items: Vec<WritebackItem>, succeeded: bool, placement: Placement) {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let mut state = self.state.lock();
        for item in &items {
            if !succeeded {
                state.mark_dirty(item.slot, now);
            }
            state.unpin(item.slot, &self.pool, &mut dropped, placement);
        }
        drop(state);
        self.unpinned.notify_all();
        drop(items);
    }

    /// For truncate to `size_bytes` (caller holds the fork's exclusive lock): waits until no
    /// block at or past the new end is pinned, drops every block wholly past it (dirty ones
    /// are discarded), and returns the pinned slot of the cached block the end falls inside,
    /// whose tail the caller must zero and then `unpin_slot`.
    pub(crate) fn truncate_blocks(&self, fork_serial: u64, size_bytes: u64) -> Option<u32> {
        let boundary = size_bytes >> self.block_shift;
        let partial = size_bytes & ((1 << self.block_shift) - 1) != 0;
        let first_dropped = if partial { boundary + 1 } else { boundary };
        let mut state = self.state.lock();
        while state.any_pinned(fork_serial, boundary) {
            self.unpinned.wait(&mut state);
        }
        let dropped = state.drop_blocks(fork_serial, first_dropped);
        let kept = match partial {
            true => state.index.get(&BlockKey { fork_serial, block: boundary }).copied(),
            false => None,
        };
        if let Some(slot) = kept {
            state.pin(slot);
        }
        drop(state);
        self.unpinned.notify_all();
        drop(dropped);
        kept
    }

    /// Drops every block of a fork (caller holds the fork's exclusive lock), discarding dirty
    /// data; waits for write-backs in flight first.
    pub(crate) fn drop_fork(&self, fork_serial: u64) {
        let mut state = self.state.lock();
        while state.any_pinned(fork_serial, 0) {
            self.unpinned.wait(&mut state);
        }
        let dropped = state.drop_blocks(fork_serial, 0);
        drop(state);
        self.unpinned.notify_all();
        drop(dropped);
    }

    /// Unpins one slot pinned by `truncate_blocks`.
    pub(crate) fn unpin_slot(&self, slot: u32) {
        let mut dropped = Vec::new();
        let released = self.state.lock().unpin(slot, &self.pool, &mut dropped, Placement::Hot);
        if released {
            self.unpinned.notify_all();
        }
    }

    /// Forgets every block (shutdown, after a flush): breaks the cache's references to forks.
    pub(crate) fn clear(&self) {
        let mut state = self.state.lock();
        let slots: Vec<u32> = (0..state.metas.len() as u32).collect();
        let dropped = state.drop_matching(&slots, |_| true);
        drop(state);
        drop(dropped);
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.state.lock().check_invariants();
    }

    /// Slots some request, prefetch or write-back holds a pin on.
    #[cfg(test)]
    pub(crate) fn pinned_slots(&self) -> usize {
        self.state.lock().metas.iter().filter(|meta| meta.refs > 0).count()
    }
}

impl CacheState {
    /// Looks every window block up, storing hit slots; returns (misses, hits now in the
    /// clean LRU, which pinning takes away from the evictable slots).
    fn look_up(&self, serial: u64, window: &mut Window) -> (usize, usize) {
        let mut misses = 0;
        let mut clean_hits = 0;
        for entry in window.blocks.iter_mut() {
            let key = BlockKey { fork_serial: serial, block: entry.block };
            match self.index.get(&key) {
                Some(&slot) => {
                    entry.slot = slot;
                    clean_hits += usize::from(self.clean_lru.contains(slot));
                }
                None => {
                    entry.slot = UNPINNED_SLOT;
                    misses += 1;
                }
            }
        }
        (misses, clean_hits)
    }

    /// Whether a block of the window the cache lacks lies in a bulk request's gate.
    fn misses_gated(&self, serial: u64, window: &Window) -> bool {
        if self.gates.is_empty() {
            return false;
        }
        window
            .blocks
            .iter()
            .filter(|entry| entry.slot == UNPINNED_SLOT)
            .any(|entry| self.gates.iter().any(|gate| gate.covers(serial, entry.block)))
    }

    fn pin(&mut self, slot: u32) {
        let meta = &mut self.metas[slot as usize];
        meta.refs += 1;
        if meta.refs == 1 {
            self.clean_lru.remove(slot);
        }
    }

    /// Drops one pin; returns whether the slot became unpinned.
    fn unpin(
        &mut self,
        slot: u32,
        pool: &SlotPool,
        dropped: &mut Vec<Arc<Fork>>,
        placement: Placement,
    ) -> bool {
        let meta = &mut self.metas[slot as usize];
        assert!(meta.refs > 0, "slot {slot} unpinned more often than pinned");
        meta.refs -= 1;
        if meta.refs > 0 {
            return false;
        }
        if pool.is_failed(slot) {
            self.unmap(slot, dropped);
        } else if !meta.dirty {
            match placement {
                Placement::Hot => self.clean_lru.push_front(slot),
                Placement::Cold => self.clean_lru.push_back(slot),
            }
        }
        true
    }

    fn mark_dirty(&mut self, slot: u32, now: Instant) {
        let meta = &mut self.metas[slot as usize];
        if meta.dirty || meta.mapping.is_none() {
            return;
        }
        meta.dirty = true;
        meta.dirty_since = now;
        self.clean_lru.remove(slot);
        self.dirty_fifo.push_back(slot);
    }

    /// A free slot, evicting the least recently used clean block if needed. The caller has
    /// checked that one exists.
    fn take_slot(&mut self, evicted: &mut Vec<Arc<Fork>>, counters: &Counters) -> u32 {
        if let Some(slot) = self.free.pop() {
            return slot;
        }
        let slot = self.clean_lru.back().expect("try_pin counted an evictable slot for every miss");
        self.unmap(slot, evicted);
        bump(&counters.evictions, 1);
        let reused = self.free.pop();
        debug_assert_eq!(reused, Some(slot));
        slot
    }

    fn assign(&mut self, slot: u32, key: BlockKey, fork: &Arc<Fork>) {
        let meta = &mut self.metas[slot as usize];
        debug_assert!(meta.mapping.is_none() && meta.refs == 0 && !meta.dirty);
        meta.mapping = Some((key, fork.clone()));
        meta.refs = 1;
        let previous = self.index.insert(key, slot);
        debug_assert!(previous.is_none(), "block mapped twice");
    }

    /// Removes a slot's block from the cache (dirty data is discarded) and frees the slot.
    fn unmap(&mut self, slot: u32, dropped: &mut Vec<Arc<Fork>>) {
        let meta = &mut self.metas[slot as usize];
        let Some((key, fork)) = meta.mapping.take() else {
            return;
        };
        meta.dirty = false;
        self.clean_lru.remove(slot);
        self.dirty_fifo.remove(slot);
        if self.index.get(&key) == Some(&slot) {
            self.index.remove(&key);
        }
        self.free.push(slot);
        dropped.push(fork);
    }

    fn dirty_slots(&self, wanted: impl Fn(&SlotMeta) -> bool) -> Vec<u32> {
        let mut slots = Vec::new();
        let mut at = self.dirty_fifo.front();
        while let Some(slot) = at {
            at = self.dirty_fifo.next_of(slot);
            if wanted(&self.metas[slot as usize]) {
                slots.push(slot);
            }
        }
        slots
    }

    /// Pins up to `count` of the oldest unpinned dirty blocks for write-back.
    fn take_dirty_unpinned(&mut self, count: usize) -> Vec<WritebackItem> {
        let mut items = Vec::new();
        let mut at = self.dirty_fifo.front();
        while let Some(slot) = at {
            if items.len() == count {
                break;
            }
            at = self.dirty_fifo.next_of(slot);
            if self.metas[slot as usize].refs == 0 {
                items.push(self.take_for_writeback(slot));
            }
        }
        items
    }

    /// Pins a dirty block and clears its dirty flag: the write-back owns it now. The fork
    /// counts the write-back from here (not from its submission), so a `sync` of the fork
    /// that no longer sees the block dirty waits for it.
    fn take_for_writeback(&mut self, slot: u32) -> WritebackItem {
        let meta = &mut self.metas[slot as usize];
        debug_assert!(meta.dirty);
        let (key, fork) = meta.mapping.clone().expect("a dirty slot is mapped");
        fork.writeback_started();
        meta.dirty = false;
        meta.refs += 1;
        self.dirty_fifo.remove(slot);
        self.clean_lru.remove(slot);
        WritebackItem { fork, block: key.block, slot }
    }

    fn any_pinned(&self, fork_serial: u64, first_block: u64) -> bool {
        self.metas.iter().any(|meta| {
            meta.refs > 0
                && matches!(&meta.mapping, Some((key, _)) if key.fork_serial == fork_serial && key.block >= first_block)
        })
    }

    fn drop_blocks(&mut self, fork_serial: u64, first_block: u64) -> Vec<Arc<Fork>> {
        let slots: Vec<u32> = (0..self.metas.len() as u32).collect();
        self.drop_matching(&slots, |key| key.fork_serial == fork_serial && key.block >= first_block)
    }

    fn drop_matching(&mut self, slots: &[u32], wanted: impl Fn(&BlockKey) -> bool) -> Vec<Arc<Fork>> {
        let mut dropped = Vec::new();
        for &slot in slots {
            let meta = &self.metas[slot as usize];
            if matches!(&meta.mapping, Some((key, _)) if wanted(key)) {
                debug_assert_eq!(meta.refs, 0);
                self.unmap(slot, &mut dropped);
            }
        }
        dropped
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let mut mapped = 0;
        for (slot, meta) in self.metas.iter().enumerate() {
            let slot = slot as u32;
            match &meta.mapping {
                Some((key, _)) => {
                    mapped += 1;
                    assert_eq!(self.index.get(key), Some(&slot));
                    let clean_unpinned = meta.refs == 0 && !meta.dirty;
                    assert_eq!(self.clean_lru.contains(slot), clean_unpinned, "slot {slot}");
                }
                None => assert!(!self.clean_lru.contains(slot) && meta.refs == 0),
            }
            assert_eq!(self.dirty_fifo.contains(slot), meta.dirty);
        }
        assert_eq!(mapped, self.index.len());
        assert_eq!(mapped + self.free.len(), self.metas.len());
    }
}
