//! One shard of the buffer cache's index and replacement state (`block_cache`).
//!
//! A shard owns the slots `s` with `s % shards == shard` (so slot `s` is local slot
//! `s / shards` here) and every block whose key hashes to it; it keeps its own index, free
//! list, clean LRU and dirty FIFO over its local slots. Methods take and return pool (global)
//! slot numbers; the lists hold local ones.
//!
//! Lists (all O(1) per operation, intrusive over local slot numbers):
//! - `free`: slots holding no block.
//! - `clean_lru`: slots holding a clean, unpinned, ready block, most recently used at the
//!   front. Eviction takes the back. Dirty blocks are not evictable until written back.
//! - `dirty_fifo`: dirty slots in the order they became dirty.
//!
//! Invariants (`check_invariants`): `index` maps exactly the keys of mapped slots, each to
//! one slot of this shard; a slot is in `clean_lru` iff mapped, unpinned and clean, in
//! `dirty_fifo` iff dirty, in `free` iff unmapped; a pinned slot is never unmapped.

use crate::block_cache::{BlockKey, Placement, WritebackItem};
use crate::fork::Fork;
use crate::lru_list::LruList;
use crate::slot_pool::SlotPool;
use crate::stats::{bump, Counters};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug)]
struct SlotMeta {
    mapping: Option<(BlockKey, Arc<Fork>)>,
    refs: u32,
    dirty: bool,
    dirty_since: Instant,
}

/// A block found in the index.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub slot: u32,
    /// It sits in the clean LRU, so pinning it takes an evictable slot away.
    pub clean: bool,
}

/// Index and lists of one shard.
#[derive(Debug)]
pub(crate) struct ShardState {
    index: HashMap<BlockKey, u32>,
    metas: Vec<SlotMeta>,
    free: Vec<u32>,
    clean_lru: LruList,
    dirty_fifo: LruList,
    shard: u32,
    shard_bits: u32,
}

impl ShardState {
    /// Shard `shard` of `1 << shard_bits` over a pool of `pool_slots` slots.
    pub(crate) fn new(shard: u32, shard_bits: u32, pool_slots: usize) -> Self {
        let shards = 1usize << shard_bits;
        let count = (pool_slots - shard as usize).div_ceil(shards);
        let now = Instant::now();
        let metas =
            (0..count).map(|_| SlotMeta { mapping: None, refs: 0, dirty: false, dirty_since: now }).collect();
        Self {
            index: HashMap::with_capacity(count),
            metas,
            free: (0..count as u32).rev().collect(),
            clean_lru: LruList::new(count),
            dirty_fifo: LruList::new(count),
            shard,
            shard_bits,
        }
    }

    fn local(&self, slot: u32) -> usize {
        debug_assert_eq!(slot & ((1 << self.shard_bits) - 1), self.shard, "slot {slot} of another shard");
        (slot >> self.shard_bits) as usize
    }

    fn global(&self, local: u32) -> u32 {
        (local << self.shard_bits) | self.shard
    }

    fn meta(&mut self, slot: u32) -> &mut SlotMeta {
        let local = self.local(slot);
        &mut self.metas[local]
    }

    /// Slots of this shard.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.metas.len()
    }

    pub(crate) fn mapped_blocks(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn dirty_blocks(&self) -> usize {
        self.dirty_fifo.len()
    }

    /// Free and clean slots: what misses may take.
    pub(crate) fn evictable_slots(&self) -> usize {
        self.free.len() + self.clean_lru.len()
    }

    pub(crate) fn find(&self, key: &BlockKey) -> Option<Found> {
        let &local = self.index.get(key)?;
        Some(Found { slot: self.global(local), clean: self.clean_lru.contains(local) })
    }

    /// Slots of the shard someone holds a pin on.
    #[cfg(test)]
    pub(crate) fn pinned_slots(&self) -> usize {
        self.metas.iter().filter(|meta| meta.refs > 0).count()
    }

    pub(crate) fn is_pinned(&self, slot: u32) -> bool {
        self.metas[self.local(slot)].refs > 0
    }

    pub(crate) fn pin(&mut self, slot: u32) {
        let local = self.local(slot);
        let meta = &mut self.metas[local];
        meta.refs += 1;
        if meta.refs == 1 {
            self.clean_lru.remove(local as u32);
        }
    }

    /// Drops one pin; returns whether the slot became unpinned.
    pub(crate) fn unpin(
        &mut self,
        slot: u32,
        pool: &SlotPool,
        dropped: &mut Vec<Arc<Fork>>,
        placement: Placement,
    ) -> bool {
        let local = self.local(slot);
        let meta = &mut self.metas[local];
        assert!(meta.refs > 0, "slot {slot} unpinned more often than pinned");
        meta.refs -= 1;
        if meta.refs > 0 {
            return false;
        }
        if pool.is_failed(slot) {
            self.unmap(slot, dropped);
        } else if !meta.dirty {
            match placement {
                Placement::Hot => self.clean_lru.push_front(local as u32),
                Placement::Cold => self.clean_lru.push_back(local as u32),
            }
        }
        true
    }

    pub(crate) fn mark_dirty(&mut self, slot: u32, now: Instant) {
        let local = self.local(slot);
        let meta = &mut self.metas[local];
        if meta.dirty || meta.mapping.is_none() {
            return;
        }
        meta.dirty = true;
        meta.dirty_since = now;
        self.clean_lru.remove(local as u32);
        self.dirty_fifo.push_back(local as u32);
    }

    /// A free slot, evicting the least recently used clean block if needed. The caller has
    /// checked that one exists.
    pub(crate) fn take_slot(&mut self, evicted: &mut Vec<Arc<Fork>>, counters: &Counters) -> u32 {
        if let Some(local) = self.free.pop() {
            return self.global(local);
        }
        let local = self.clean_lru.back().expect("try_pin counted an evictable slot for every miss");
        let slot = self.global(local);
        self.unmap(slot, evicted);
        bump(&counters.evictions, 1);
        let reused = self.free.pop();
        debug_assert_eq!(reused, Some(local));
        slot
    }

    /// Maps a taken slot to `key`, pinned once.
    pub(crate) fn assign(&mut self, slot: u32, key: BlockKey, fork: &Arc<Fork>) {
        let local = self.local(slot) as u32;
        let meta = self.meta(slot);
        debug_assert!(meta.mapping.is_none() && meta.refs == 0 && !meta.dirty);
        meta.mapping = Some((key, fork.clone()));
        meta.refs = 1;
        let previous = self.index.insert(key, local);
        debug_assert!(previous.is_none(), "block mapped twice");
    }

    /// Removes a slot's block from the cache (dirty data is discarded) and frees the slot.
    pub(crate) fn unmap(&mut self, slot: u32, dropped: &mut Vec<Arc<Fork>>) {
        let local = self.local(slot) as u32;
        let meta = self.meta(slot);
        let Some((key, fork)) = meta.mapping.take() else {
            return;
        };
        meta.dirty = false;
        self.clean_lru.remove(local);
        self.dirty_fifo.remove(local);
        if self.index.get(&key) == Some(&local) {
            self.index.remove(&key);
        }
        self.free.push(local);
        dropped.push(fork);
    }

    /// Dirty slots whose key `wanted` accepts, oldest first.
    pub(crate) fn dirty_slots(&self, wanted: impl Fn(&BlockKey) -> bool) -> Vec<u32> {
        let mut slots = Vec::new();
        let mut at = self.dirty_fifo.front();
        while let Some(local) = at {
            at = self.dirty_fifo.next_of(local);
            if matches!(&self.metas[local as usize].mapping, Some((key, _)) if wanted(key)) {
                slots.push(self.global(local));
            }
        }
        slots
    }

    /// The oldest dirty slot and since when it is dirty.
    pub(crate) fn oldest_dirty(&self) -> Option<(u32, Instant)> {
        let local = self.dirty_fifo.front()?;
        Some((self.global(local), self.metas[local as usize].dirty_since))
    }

    /// Whether the slot holds a dirty block.
    pub(crate) fn is_dirty(&self, slot: u32) -> bool {
        self.metas[self.local(slot)].dirty
    }

    /// Pins up to `count` of the oldest unpinned dirty blocks for write-back.
    pub(crate) fn take_dirty_unpinned(&mut self, count: usize) -> Vec<WritebackItem> {
        let mut slots = Vec::new();
        let mut at = self.dirty_fifo.front();
        while let Some(local) = at {
            if slots.len() == count {
                break;
            }
            at = self.dirty_fifo.next_of(local);
            if self.metas[local as usize].refs == 0 {
                slots.push(self.global(local));
            }
        }
        slots.into_iter().map(|slot| self.take_for_writeback(slot)).collect()
    }

    /// Pins a dirty block and clears its dirty flag: the write-back owns it now. The fork
    /// counts the write-back from here (not from its submission), so a `sync` of the fork
    /// that no longer sees the block dirty waits for it.
    pub(crate) fn take_for_writeback(&mut self, slot: u32) -> WritebackItem {
        let local = self.local(slot) as u32;
        let meta = self.meta(slot);
        debug_assert!(meta.dirty);
        let (key, fork) = meta.mapping.clone().expect("a dirty slot is mapped");
        fork.writeback_started();
        meta.dirty = false;
        meta.refs += 1;
        self.dirty_fifo.remove(local);
        self.clean_lru.remove(local);
        WritebackItem { fork, block: key.block, slot }
    }

    /// Whether a block of the fork at or past `first_block` is pinned.
    pub(crate) fn any_pinned(&self, fork_serial: u64, first_block: u64) -> bool {
        self.metas.iter().any(|meta| {
            meta.refs > 0
                && matches!(&meta.mapping, Some((key, _)) if key.fork_serial == fork_serial && key.block >= first_block)
        })
    }

    /// Unmaps every (unpinned) block whose key `wanted` accepts.
    pub(crate) fn drop_matching(&mut self, wanted: impl Fn(&BlockKey) -> bool) -> Vec<Arc<Fork>> {
        let mut dropped = Vec::new();
        for local in 0..self.metas.len() as u32 {
            let meta = &self.metas[local as usize];
            if matches!(&meta.mapping, Some((key, _)) if wanted(key)) {
                debug_assert_eq!(meta.refs, 0);
                self.unmap(self.global(local), &mut dropped);
            }
        }
        dropped
    }

    /// Checks the invariants; `shard_of` says which shard a key belongs to.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self, shard_of: impl Fn(&BlockKey) -> usize) {
        let mut mapped = 0;
        for (local, meta) in self.metas.iter().enumerate() {
            let local = local as u32;
            match &meta.mapping {
                Some((key, _)) => {
                    mapped += 1;
                    assert_eq!(self.index.get(key), Some(&local));
                    assert_eq!(shard_of(key), self.shard as usize, "{key:?} in the wrong shard");
                    let clean_unpinned = meta.refs == 0 && !meta.dirty;
                    assert_eq!(self.clean_lru.contains(local), clean_unpinned, "local slot {local}");
                }
                None => assert!(!self.clean_lru.contains(local) && meta.refs == 0),
            }
            assert_eq!(self.dirty_fifo.contains(local), meta.dirty);
        }
        assert_eq!(mapped, self.index.len());
        assert_eq!(mapped + self.free.len(), self.metas.len());
    }
}
