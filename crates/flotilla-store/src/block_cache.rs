//! The buffer cache's index and replacement state (Galley's CacheManager), sharded.
//!
//! Blocks are keyed by (fork serial, block number); a fork serial stands for (target, file,
//! subfile, fork name) and is never reused, see `fork`. The bytes live in the `SlotPool`;
//! this type decides which slot holds which block.
//!
//! Shards (issue 12, in the style of RocksDB's sharded LRU cache): the index and lists are
//! split into `shards` (a power of two) `ShardState`s, each behind its own mutex with its own
//! condition variable `room`, owning the slots `s` with `s % shards == shard` and its own
//! index, free list, clean LRU and dirty FIFO (`cache_shard`). A block's shard is a hash of
//! (fork serial, block >> `SHARD_GROUP_BLOCKS_LOG2`): runs of 8 adjacent blocks (256 KiB
//! with the default 32 KiB blocks, the default `bulk_bytes_min`) share a shard, so a small
//! request usually locks one mutex and a shard's pressure write-back hands the disk scheduler
//! runs it can coalesce, while a large window still spreads over the shards. Cache hits on
//! blocks of different shards take different mutexes and never contend. A slot's shard is
//! its number modulo `shards`, so unpinning needs no hashing. Replacement is LRU per shard.
//!
//! Geometry (`cache_geometry`): every shard holds at least `slots / shards` slots and a
//! window pins at most that many blocks (and, as before, at most half the cache), so any
//! window fits in an empty cache even if all of its blocks hash to one shard. The configured
//! count (`cache_shards`, default 8) is halved until each shard keeps
//! `min(SHARD_SLOTS_MIN, slots / 2)` slots, so tiny caches get 1 or 2 shards and windows of
//! half the cache, as before sharding.
//!
//! Lock order: shard mutexes in ascending shard order, then the gate list's mutex
//! (`cache_gates`). A thread never takes a lower shard while holding a higher one, and never a
//! shard while holding the gate list. Operations on one shard at a time (`take_dirty`,
//! truncation, `begin_bulk`'s scan, `take_dirty_aged`) lock one at a time; `try_pin`,
//! `pin_if_room`, `unpin_window` and `finish_writeback` lock all the shards they touch,
//! ascending (`pin_if_room` then the gate list, never waiting).
//!
//! Waiting and wake-ups: nobody waits holding a pin of its own or more than one mutex.
//! - `try_pin` whose misses lie in a bulk gate waits on the gate list's condition variable,
//!   after releasing its shard locks while holding the gate list's mutex, so a gate closing
//!   in between is not missed; closing a gate wakes those waiters.
//! - `try_pin` lacking room in some shards (and with no dirty unpinned block there to write
//!   back) releases every other shard and waits on the `room` of the first lacking shard, whose
//!   mutex it still holds: any unpin there (it happens under that mutex) is seen or wakes it.
//!   That shard lacks room only because of pins (every pin is released without waiting for
//!   room) or dirty blocks being written back (their end unpins them), so the wake-up comes.
//!   Once that shard has room the retry waits on the next lacking one, if any.
//! - An unpin, a finished write-back or dropped blocks notify only their own shards' `room`.
//! - Truncation and fork removal wait, shard by shard, on the `room` of a shard holding a pinned
//!   block of the fork; its unpin wakes them.
//!
//! Bulk gates: see `cache_gates`. `begin_bulk` opens its gate first (waiting out conflicting
//! gates), then looks at its blocks shard by shard; `try_pin` checks its misses against the
//! gates while holding the shards of those misses, so a block missing when `begin_bulk` looked
//! is never mapped while the gate is open.
//!
//! Invariants (checked by `check_invariants` in tests; per shard, see `cache_shard`):
//! - A shard's index maps exactly the keys of its mapped slots, each key hashing to that
//!   shard; a key maps to at most one slot.
//! - A slot with `refs > 0` is never evicted or reassigned; a request holds a pin on every
//!   block of its window, a write-back holds one until the disk wrote the block.
//! - A slot is in its shard's `clean_lru` iff it is mapped, unpinned and clean; in
//!   `dirty_fifo` iff dirty; in `free` iff unmapped.
//! - Pinning is all-or-nothing per window: if the free and clean slots of every shard the
//!   window touches cannot take its misses there, nothing is pinned and the caller writes
//!   back dirty blocks or waits for unpins holding no pins itself, so requests cannot
//!   deadlock on each other.
//! - The writer of a block marks it dirty after copying into it; a flusher clears the dirty
//!   flag before the disk reads the bytes. Either order of a racing copy and write-back
//!   therefore leaves the newest bytes on disk or the block dirty.

use crate::cache_gates::{GateList, Gates};
use crate::cache_shard::ShardState;
use crate::fork::Fork;
use crate::slot_pool::SlotPool;
use crate::stats::{bump, Counters};
use crate::window::{BlockAction, Window};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::Arc;
use std::time::Instant;

const UNPINNED_SLOT: u32 = u32::MAX;
/// Under memory pressure, write back at least this many dirty blocks of a shard at once, so
/// the disk scheduler gets runs to coalesce instead of single blocks.
const PRESSURE_WRITEBACK_BLOCKS_MIN: usize = 32;
/// Blocks `g << 3 ..= (g << 3) + 7` of a fork (a shard group) share a shard.
pub(crate) const SHARD_GROUP_BLOCKS_LOG2: u32 = 3;
/// A shard keeps at least this many slots (or half the cache, if smaller): fewer shards
/// rather than windows smaller than this.
pub(crate) const SHARD_SLOTS_MIN: usize = 64;
/// A window holds at least this many bytes (or half the cache, if smaller): fewer shards
/// rather than windows smaller than this. It is the default `request_bytes_max`, so with the
/// default limits every request fits in one window, is pinned at once and may be parked
/// (`prefetch` declines requests of several windows), as before sharding.
pub(crate) const WINDOW_BYTES_MIN: u64 = 64 << 20;
/// 2^64 divided by the golden ratio: multiplying by it spreads consecutive keys over the
/// high bits (Fibonacci hashing).
const FIBONACCI_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// How the cache is cut up, from its size and the configured shard count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheGeometry {
    /// Shards in use: a power of two.
    pub shards: usize,
    /// Most distinct blocks one request window pins: at most one shard's slots and at most
    /// half the cache.
    pub window_blocks_max: usize,
}

/// The geometry of a cache of `slots` blocks with `shards_configured` (a power of two)
/// asked for: halves the shard count until every shard holds `min(shard_slots_min, slots/2)`
/// (`SHARD_SLOTS_MIN` but in tests) and a window holds `min(window_blocks_min, slots/2)`
/// blocks (`WINDOW_BYTES_MIN` in blocks but in tests), so sharding never makes the largest
/// request served in one window smaller than before sharding.
pub(crate) fn cache_geometry(
    slots: usize,
    shards_configured: usize,
    (shard_slots_min, window_blocks_min): (usize, usize),
) -> CacheGeometry {
    let shard_slots_min = shard_slots_min.min(slots / 2).max(1);
    let window_blocks_min = window_blocks_min.min(slots / 2).max(1);
    let window_blocks = |shards: usize| (slots / shards.max(2)).max(1);
    let mut shards = shards_configured.max(1);
    while shards > 1 && (slots / shards < shard_slots_min || window_blocks(shards) < window_blocks_min) {
        shards /= 2;
    }
    CacheGeometry { shards, window_blocks_max: window_blocks(shards) }
}

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
    /// Not enough room and nothing to write back, or a miss in a bulk gate; waited for an
    /// unpin or the gate, try again.
    Retry,
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
        self.cache.gates.close(self.id);
    }
}

#[derive(Debug)]
struct Shard {
    state: Mutex<ShardState>,
    /// Signalled when a slot of the shard is unpinned or freed.
    room: Condvar,
}

/// What a window asks of one shard it touches.
#[derive(Clone, Copy, Debug, Default)]
struct Demand {
    misses: usize,
    /// Hits now in the clean LRU, which pinning takes away from the evictable slots.
    clean_hits: usize,
}

impl Demand {
    /// Misses the shard cannot take without writing back or waiting.
    fn shortfall(&self, state: &ShardState) -> usize {
        self.misses.saturating_sub(state.evictable_slots() - self.clean_hits)
    }
}

/// Index and replacement policy of the buffer cache.
#[derive(Debug)]
pub(crate) struct BlockCache {
    pool: Arc<SlotPool>,
    shards: Box<[Shard]>,
    shard_bits: u32,
    gates: Gates,
    counters: Arc<Counters>,
    block_shift: u32,
}

/// Position of `shard`'s guard among the guards of the shards in `mask`, ascending.
fn position(mask: u64, shard: usize) -> usize {
    (mask & ((1u64 << shard) - 1)).count_ones() as usize
}

/// The shards in `mask`, ascending.
fn shards_in(mask: u64) -> impl Iterator<Item = usize> {
    (0..u64::BITS as usize).filter(move |&shard| mask & (1 << shard) != 0)
}

impl BlockCache {
    /// A cache over the pool's slots in `shards` shards (a power of two, at most
    /// `CACHE_SHARDS_MAX` and the number of slots).
    pub(crate) fn new(pool: Arc<SlotPool>, counters: Arc<Counters>, shards: usize) -> Self {
        assert!(shards.is_power_of_two() && shards <= crate::config::CACHE_SHARDS_MAX);
        assert!(shards <= pool.count(), "{shards} shards for {} slots", pool.count());
        let shard_bits = shards.trailing_zeros();
        let shards = (0..shards as u32)
            .map(|shard| Shard {
                state: Mutex::new(ShardState::new(shard, shard_bits, pool.count())),
                room: Condvar::new(),
            })
            .collect();
        Self {
            block_shift: pool.block_bytes().trailing_zeros(),
            pool,
            shards,
            shard_bits,
            gates: Gates::default(),
            counters,
        }
    }

    pub(crate) fn pool(&self) -> &Arc<SlotPool> {
        &self.pool
    }

    /// Number of shards.
    #[cfg(test)]
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard of a block: a Fibonacci hash of (fork serial, shard group).
    pub(crate) fn shard_of(&self, fork_serial: u64, block: u64) -> usize {
        if self.shard_bits == 0 {
            return 0;
        }
        let group = block >> SHARD_GROUP_BLOCKS_LOG2;
        let mixed = (fork_serial.rotate_left(32) ^ group).wrapping_mul(FIBONACCI_MULTIPLIER);
        (mixed >> (u64::BITS - self.shard_bits)) as usize
    }

    /// The shard owning a slot.
    fn shard_of_slot(&self, slot: u32) -> usize {
        slot as usize & (self.shards.len() - 1)
    }

    /// Locks one shard, counting the times it was already held (`cache_lock_waits`).
    fn lock_shard(&self, shard: usize) -> MutexGuard<'_, ShardState> {
        let mutex = &self.shards[shard].state;
        if let Some(guard) = mutex.try_lock() {
            return guard;
        }
        bump(&self.counters.cache_lock_waits, 1);
        mutex.lock()
    }

    /// Locks the shards in `mask` in ascending order (the lock order).
    fn lock_shards(&self, mask: u64) -> Vec<MutexGuard<'_, ShardState>> {
        shards_in(mask).map(|shard| self.lock_shard(shard)).collect()
    }

    fn notify_shards(&self, mask: u64) {
        for shard in shards_in(mask) {
            self.shards[shard].room.notify_all();
        }
    }

    fn slots_mask<'a>(&self, slots: impl Iterator<Item = &'a u32>) -> u64 {
        slots.fold(0, |mask, &slot| mask | 1 << self.shard_of_slot(slot))
    }

    /// Bytes of dirty blocks.
    pub(crate) fn dirty_bytes(&self) -> u64 {
        let blocks: usize = (0..self.shards.len()).map(|shard| self.lock_shard(shard).dirty_blocks()).sum();
        blocks as u64 * self.pool.block_bytes() as u64
    }

    /// Bytes of blocks holding data.
    pub(crate) fn cached_bytes(&self) -> u64 {
        let blocks: usize = (0..self.shards.len()).map(|shard| self.lock_shard(shard).mapped_blocks()).sum();
        blocks as u64 * self.pool.block_bytes() as u64
    }

    /// Pins every block of the window, or pins nothing and says what to do first.
    pub(crate) fn try_pin(&self, fork: &Arc<Fork>, window: &mut Window, writing: bool) -> PinOutcome {
        let serial = fork.serial();
        let (mask, mut locked, size_bytes) = self.lock_window(fork, window);
        let (misses, demands) = self.look_up(&locked, mask, serial, window);
        if let Some(mut gates) = self.gated_misses(misses, serial, window) {
            // A bulk request is moving some of these blocks around the cache; wait for it,
            // holding the gate list but no shard.
            drop(locked);
            self.gates.wait_for_close(&mut gates);
            return PinOutcome::Retry;
        }
        if let Some(outcome) = self.make_room(&mut locked, mask, &demands) {
            return outcome;
        }
        self.pin_found_and_missing(locked, mask, fork, window, (size_bytes, misses), writing);
        PinOutcome::Pinned
    }

    /// `try_pin` that never waits and never asks for a write-back (a prefetch): pins every
    /// block of the window and returns true, or pins nothing and returns false when the
    /// free and clean slots of some shard the window touches cannot take its misses there,
    /// or a bulk gate covers one of them. Locks the window's shards ascending, like
    /// `try_pin`, then (never waiting) the gate list, and releases all before returning.
    pub(crate) fn pin_if_room(&self, fork: &Arc<Fork>, window: &mut Window, writing: bool) -> bool {
        let serial = fork.serial();
        let (mask, locked, size_bytes) = self.lock_window(fork, window);
        let (misses, demands) = self.look_up(&locked, mask, serial, window);
        let lacking = demands.iter().zip(locked.iter()).any(|(demand, state)| demand.shortfall(state) > 0);
        if lacking || self.gated_misses(misses, serial, window).is_some() {
            return false;
        }
        self.pin_found_and_missing(locked, mask, fork, window, (size_bytes, misses), writing);
        true
    }

    /// Locks every shard the window touches, ascending; returns their mask, the guards and the
    /// fork's size. The size is read under the locks: a writer raises the size before it
    /// unpins (under its blocks' shard locks), so a block written, written back and evicted
    /// since is not mistaken for a hole.
    fn lock_window(&self, fork: &Arc<Fork>, window: &Window) -> (u64, Vec<MutexGuard<'_, ShardState>>, u64) {
        let serial = fork.serial();
        let mask =
            window.blocks.iter().fold(0u64, |mask, entry| mask | 1 << self.shard_of(serial, entry.block));
        let locked = self.lock_shards(mask);
        (mask, locked, fork.size_bytes())
    }

    /// The gate list, locked, if an open bulk gate covers one of the window's `misses`
    /// missing blocks (looked up); `None` otherwise. Takes the gate list's mutex after the
    /// shards, as the lock order says, and never waits.
    fn gated_misses(&self, misses: usize, serial: u64, window: &Window) -> Option<MutexGuard<'_, GateList>> {
        if misses == 0 || !self.gates.any_open() {
            return None;
        }
        let gates = self.gates.lock();
        let missing = window.blocks.iter().filter(|entry| entry.slot == UNPINNED_SLOT);
        gates.covers_any(serial, missing.map(|entry| entry.block)).then_some(gates)
    }

    /// Pins the window's cached blocks and gives its misses slots (the caller checked the
    /// room in every locked shard), then unlocks and counts hits and misses.
    fn pin_found_and_missing(
        &self,
        mut locked: Vec<MutexGuard<'_, ShardState>>,
        mask: u64,
        fork: &Arc<Fork>,
        window: &mut Window,
        (size_bytes, misses): (u64, usize),
        writing: bool,
    ) {
        for entry in window.blocks.iter_mut().filter(|entry| entry.slot != UNPINNED_SLOT) {
            locked[position(mask, self.shard_of_slot(entry.slot))].pin(entry.slot);
            entry.action = BlockAction::Hit;
        }
        let evicted = self.assign_misses(&mut locked, mask, fork, window, size_bytes, writing);
        drop(locked);
        drop(evicted);
        bump(&self.counters.cache_hits, (window.blocks.len() - misses) as u64);
        bump(&self.counters.cache_misses, misses as u64);
    }

    /// Looks every window block up in its (locked) shard, storing hit slots; returns the
    /// misses and what the window asks of each shard, in `locked` order.
    fn look_up(
        &self,
        locked: &[MutexGuard<'_, ShardState>],
        mask: u64,
        serial: u64,
        window: &mut Window,
    ) -> (usize, Vec<Demand>) {
        let mut demands = vec![Demand::default(); locked.len()];
        let mut misses = 0;
        for entry in window.blocks.iter_mut() {
            let at = position(mask, self.shard_of(serial, entry.block));
            let demand = &mut demands[at];
            match locked[at].find(&BlockKey { fork_serial: serial, block: entry.block }) {
                Some(found) => {
                    entry.slot = found.slot;
                    demand.clean_hits += usize::from(found.clean);
                }
                None => {
                    entry.slot = UNPINNED_SLOT;
                    demand.misses += 1;
                    misses += 1;
                }
            }
        }
        (misses, demands)
    }

    /// `None` if every shard can take the window's misses; else the dirty blocks of the
    /// shards lacking room to write back, or (if they have none unpinned) waits for an unpin
    /// in the first of them, having released every other shard.
    fn make_room(
        &self,
        locked: &mut Vec<MutexGuard<'_, ShardState>>,
        mask: u64,
        demands: &[Demand],
    ) -> Option<PinOutcome> {
        let lacking: Vec<usize> =
            (0..locked.len()).filter(|&at| demands[at].shortfall(&locked[at]) > 0).collect();
        let &first = lacking.first()?;
        let mut batch = Vec::new();
        for &at in &lacking {
            let wanted = demands[at].shortfall(&locked[at]).max(PRESSURE_WRITEBACK_BLOCKS_MIN);
            batch.extend(locked[at].take_dirty_unpinned(wanted));
        }
        if !batch.is_empty() {
            return Some(PinOutcome::WriteBack(batch));
        }
        let shard = shards_in(mask).nth(first).expect("a locked shard is in the mask");
        let mut state = std::mem::take(locked).swap_remove(first);
        self.shards[shard].room.wait(&mut state);
        Some(PinOutcome::Retry)
    }

    /// Gives every missing block of the window a slot of its shard, pinned and loading, and
    /// decides how it is loaded. Returns the forks of evicted blocks, to be dropped after
    /// unlocking.
    fn assign_misses(
        &self,
        locked: &mut [MutexGuard<'_, ShardState>],
        mask: u64,
        fork: &Arc<Fork>,
        window: &mut Window,
        size_bytes: u64,
        writing: bool,
    ) -> Vec<Arc<Fork>> {
        let mut evicted = Vec::new();
        for at in 0..window.blocks.len() {
            if window.blocks[at].slot != UNPINNED_SLOT {
                continue;
            }
            let block = window.blocks[at].block;
            let beyond_end = block << self.block_shift >= size_bytes;
            let zero = beyond_end || (writing && window.fully_covered(at));
            let state = &mut locked[position(mask, self.shard_of(fork.serial(), block))];
            let slot = state.take_slot(&mut evicted, &self.counters);
            state.assign(slot, BlockKey { fork_serial: fork.serial(), block }, fork);
            self.pool.begin_loading(slot);
            let entry = &mut window.blocks[at];
            entry.slot = slot;
            entry.action = if zero { BlockAction::Zero } else { BlockAction::Read };
        }
        evicted
    }

    /// Starts a bulk request over blocks `first..end` of a fork: waits out conflicting bulk
    /// requests and opens its gate, then splits the range into runs, looking at one shard at
    /// a time. A block the cache holds stays on the cache path, except that a bulk write
    /// drops every such block nobody has pinned (clean or dirty: the write replaces all of
    /// its bytes). Every other block is `direct`, and the returned gate keeps the cache from
    /// taking it up until the gate is dropped. The caller holds no pins; it must drop the
    /// gate before it sends runs through the cache path.
    pub(crate) fn begin_bulk(
        &self,
        fork_serial: u64,
        first: u64,
        end: u64,
        write: bool,
    ) -> (Vec<BulkRun>, BulkGate<'_>) {
        let gate = BulkGate { cache: self, id: self.gates.open(fork_serial, first, end, write) };
        let mut runs: Vec<BulkRun> = Vec::new();
        let mut dropped = Vec::new();
        let mut dropped_mask = 0u64;
        let mut current: Option<(usize, MutexGuard<'_, ShardState>)> = None;
        for block in first..end {
            let shard = self.shard_of(fork_serial, block);
            if current.as_ref().map(|(locked, _)| *locked) != Some(shard) {
                drop(current.take());
                current = Some((shard, self.lock_shard(shard)));
            }
            let Some((_, state)) = current.as_mut() else { unreachable!("locked above") };
            let key = BlockKey { fork_serial, block };
            let direct = match state.find(&key) {
                None => true,
                Some(found) if write && !state.is_pinned(found.slot) => {
                    state.unmap(found.slot, &mut dropped);
                    dropped_mask |= 1 << shard;
                    true
                }
                Some(_) => false,
            };
            match runs.last_mut() {
                Some(run) if run.direct == direct => run.end = block + 1,
                _ => runs.push(BulkRun { first: block, end: block + 1, direct }),
            }
        }
        drop(current);
        self.notify_shards(dropped_mask);
        drop(dropped);
        (runs, gate)
    }

    /// Unpins every block of the window; blocks a writer touched become dirty first.
    pub(crate) fn unpin_window(&self, window: &mut Window) {
        let now = Instant::now();
        let pinned = |slot: &&u32| **slot != UNPINNED_SLOT;
        let mask = self.slots_mask(window.blocks.iter().map(|entry| &entry.slot).filter(pinned));
        let mut released_mask = 0u64;
        let mut dropped = Vec::new();
        let mut locked = self.lock_shards(mask);
        for entry in window.blocks.iter_mut().filter(|entry| entry.slot != UNPINNED_SLOT) {
            let shard = self.shard_of_slot(entry.slot);
            let state = &mut locked[position(mask, shard)];
            if entry.touched {
                state.mark_dirty(entry.slot, now);
            }
            if state.unpin(entry.slot, &self.pool, &mut dropped, Placement::Hot) {
                released_mask |= 1 << shard;
            }
            entry.slot = UNPINNED_SLOT;
        }
        drop(locked);
        self.notify_shards(released_mask);
    }

    /// Pins dirty blocks for write-back: those of one fork (`Some(serial)`) or all. Walks the
    /// shards one at a time.
    pub(crate) fn take_dirty(&self, fork_serial: Option<u64>) -> Vec<WritebackItem> {
        let mut items = Vec::new();
        for shard in 0..self.shards.len() {
            let mut state = self.lock_shard(shard);
            let slots = state.dirty_slots(|key| match fork_serial {
                None => true,
                Some(serial) => key.fork_serial == serial,
            });
            items.extend(slots.into_iter().map(|slot| state.take_for_writeback(slot)));
        }
        items
    }

    /// Pins for write-back those of `blocks` of fork `fork_serial` that are cached and dirty
    /// (the WriteFull policy).
    pub(crate) fn take_dirty_blocks(&self, fork_serial: u64, blocks: &[u64]) -> Vec<WritebackItem> {
        let mut items = Vec::new();
        for &block in blocks {
            let mut state = self.lock_shard(self.shard_of(fork_serial, block));
            let Some(found) = state.find(&BlockKey { fork_serial, block }) else { continue };
            if state.is_dirty(found.slot) {
                items.push(state.take_for_writeback(found.slot));
            }
        }
        items
    }

    /// Pins for write-back the blocks dirty since `cutoff` or earlier (none if `None`), and,
    /// while more than `dirty_bytes_high_max` are dirty, about the oldest ones until at most
    /// half of it are: each shard gives its oldest, in proportion to its share of the dirty
    /// blocks. Locks one shard at a time (the flusher never stalls every shard at once), so
    /// the oldest-first order holds within a shard, not across shards.
    pub(crate) fn take_dirty_aged(
        &self,
        cutoff: Option<Instant>,
        dirty_bytes_high_max: u64,
    ) -> Vec<WritebackItem> {
        let block_bytes = self.pool.block_bytes() as u64;
        let dirty_bytes = self.dirty_bytes();
        let excess_bytes = match dirty_bytes > dirty_bytes_high_max {
            true => dirty_bytes - dirty_bytes_high_max / 2,
            false => 0,
        };
        let excess_blocks = excess_bytes.div_ceil(block_bytes);
        let dirty_blocks = (dirty_bytes / block_bytes).max(1);
        let mut items = Vec::new();
        for shard in 0..self.shards.len() {
            let mut state = self.lock_shard(shard);
            let mut share = (excess_blocks * state.dirty_blocks() as u64).div_ceil(dirty_blocks);
            while let Some((slot, since)) = state.oldest_dirty() {
                let aged = matches!(cutoff, Some(cutoff) if since <= cutoff);
                if share == 0 && !aged {
                    break;
                }
                share = share.saturating_sub(1);
                items.push(state.take_for_writeback(slot));
            }
        }
        items
    }

    /// Ends a write-back: unpins, and on failure marks the blocks dirty again.
    pub(crate) fn finish_writeback(&self, items: Vec<WritebackItem>, succeeded: bool, placement: Placement) {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let mask = self.slots_mask(items.iter().map(|item| &item.slot));
        let mut locked = self.lock_shards(mask);
        for item in &items {
            let state = &mut locked[position(mask, self.shard_of_slot(item.slot))];
            if !succeeded {
                state.mark_dirty(item.slot, now);
            }
            state.unpin(item.slot, &self.pool, &mut dropped, placement);
        }
        drop(locked);
        self.notify_shards(mask);
        drop(items);
    }

    /// For truncate to `size_bytes` (caller holds the fork's exclusive lock): waits until no
    /// block at or past the new end is pinned, drops every block wholly past it (dirty ones
    /// are discarded), and returns the pinned slot of the cached block the end falls inside,
    /// whose tail the caller must zero and then `unpin_slot`. Goes shard by shard, the shard
    /// of that block last, so it never waits holding the pin it takes.
    pub(crate) fn truncate_blocks(&self, fork_serial: u64, size_bytes: u64) -> Option<u32> {
        let boundary = size_bytes >> self.block_shift;
        let partial = size_bytes & ((1 << self.block_shift) - 1) != 0;
        let first_dropped = if partial { boundary + 1 } else { boundary };
        let boundary_shard = self.shard_of(fork_serial, boundary);
        let others = (0..self.shards.len()).filter(|&shard| shard != boundary_shard);
        for shard in others.chain([boundary_shard]) {
            let mut state = self.settled_shard(shard, fork_serial, boundary);
            let dropped =
                state.drop_matching(|key| key.fork_serial == fork_serial && key.block >= first_dropped);
            let kept = match partial && shard == boundary_shard {
                true => state.find(&BlockKey { fork_serial, block: boundary }).map(|found| found.slot),
                false => None,
            };
            if let Some(slot) = kept {
                state.pin(slot);
            }
            drop(state);
            self.shards[shard].room.notify_all();
            drop(dropped);
            if shard == boundary_shard {
                return kept;
            }
        }
        unreachable!("the boundary shard comes last")
    }

    /// Locks a shard once no block of the fork at or past `first_block` in it is pinned.
    fn settled_shard(&self, shard: usize, fork_serial: u64, first_block: u64) -> MutexGuard<'_, ShardState> {
        let mut state = self.lock_shard(shard);
        while state.any_pinned(fork_serial, first_block) {
            self.shards[shard].room.wait(&mut state);
        }
        state
    }

    /// Drops every block of a fork (caller holds the fork's exclusive lock), discarding dirty
    /// data; waits for write-backs in flight first.
    pub(crate) fn drop_fork(&self, fork_serial: u64) {
        for shard in 0..self.shards.len() {
            let mut state = self.settled_shard(shard, fork_serial, 0);
            let dropped = state.drop_matching(|key| key.fork_serial == fork_serial);
            drop(state);
            self.shards[shard].room.notify_all();
            drop(dropped);
        }
    }

    /// Unpins one slot pinned by `truncate_blocks`.
    pub(crate) fn unpin_slot(&self, slot: u32) {
        let mut dropped = Vec::new();
        let shard = self.shard_of_slot(slot);
        let released = self.lock_shard(shard).unpin(slot, &self.pool, &mut dropped, Placement::Hot);
        if released {
            self.shards[shard].room.notify_all();
        }
    }

    /// Forgets every block (shutdown, after a flush): breaks the cache's references to forks.
    pub(crate) fn clear(&self) {
        for shard in 0..self.shards.len() {
            let dropped = self.lock_shard(shard).drop_matching(|_| true);
            drop(dropped);
        }
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        for shard in 0..self.shards.len() {
            let state = self.lock_shard(shard);
            assert_eq!(state.slot_count(), (self.pool.count() - shard).div_ceil(self.shards.len()));
            state.check_invariants(|key| self.shard_of(key.fork_serial, key.block));
        }
        self.gates.check_invariants();
    }

    /// Slots some request, prefetch or write-back holds a pin on.
    #[cfg(test)]
    pub(crate) fn pinned_slots(&self) -> usize {
        (0..self.shards.len()).map(|shard| self.lock_shard(shard).pinned_slots()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_caches_get_fewer_shards_and_every_shard_holds_a_window() {
        let cases = [
            // (slots, configured, shards, window)
            (4, 8, 2, 2),
            (6, 8, 2, 3),
            (6, 1, 1, 3),
            (256, 8, 4, 64),
            (2048, 8, 8, 256),
            (2048, 64, 32, 64),
            (8192, 8, 8, 1024),
            (8192, 1, 1, 4096),
        ];
        for (slots, configured, shards, window) in cases {
            let geometry = cache_geometry(slots, configured, (SHARD_SLOTS_MIN, 1));
            assert_eq!(geometry, CacheGeometry { shards, window_blocks_max: window }, "{slots} {configured}");
            assert!(geometry.window_blocks_max <= slots / geometry.shards, "a shard holds a window");
            assert!(geometry.window_blocks_max <= slots / 2);
        }
        assert_eq!(cache_geometry(16, 8, (2, 1)), CacheGeometry { shards: 8, window_blocks_max: 2 });
    }

    #[test]
    fn windows_keep_the_size_they_had_before_sharding() {
        // 32 KiB blocks; 64 MiB windows are 2048 blocks.
        let cases = [
            // (cache MiB, shards, window MiB): half the cache below 128 MiB, 64 MiB above.
            (64, 2, 32),
            (128, 2, 64),
            (256, 4, 64),
            (512, 8, 64),
            (2048, 8, 256),
        ];
        let window_blocks_min = (WINDOW_BYTES_MIN >> 15) as usize;
        for (cache_mib, shards, window_mib) in cases {
            let slots = cache_mib << 5;
            let geometry = cache_geometry(slots, 8, (SHARD_SLOTS_MIN, window_blocks_min));
            assert_eq!(
                geometry,
                CacheGeometry { shards, window_blocks_max: window_mib << 5 },
                "{cache_mib} MiB"
            );
            // Never smaller than before sharding (half the cache) or than the default largest
            // request.
            assert!(geometry.window_blocks_max >= (slots / 2).min(window_blocks_min));
        }
    }

    #[test]
    fn adjacent_blocks_share_a_shard_and_groups_spread_over_all() {
        let pool = Arc::new(SlotPool::new(64, 512, false).unwrap());
        let cache = BlockCache::new(pool, Arc::new(Counters::default()), 8);
        for serial in [1u64, 2, 1 << 40] {
            let mut used = [0usize; 8];
            for group in 0..256u64 {
                let first = group << SHARD_GROUP_BLOCKS_LOG2;
                let shard = cache.shard_of(serial, first);
                assert!((first..first + 8).all(|block| cache.shard_of(serial, block) == shard));
                used[shard] += 1;
            }
            // 256 groups over 8 shards: 32 each on average; none starved or flooded.
            assert!(used.iter().all(|&count| (16..=48).contains(&count)), "{serial}: {used:?}");
        }
        assert_eq!(cache.shard_of_slot(13), 5);
    }
}
