//! The WriteFull write policy, the buffer-cache policy of the ENWRICH paper's traditional
//! caching baseline (§4): a cached block goes to disk as soon as writes have covered all of
//! it, instead of waiting for eviction, a sync or its age. The write-back runs on a thread of
//! its own, so the write that filled the block is answered at once.
//!
//! `Coverage` (pure) counts the bytes written into each block not yet full; bytes written
//! twice count twice (the HPF patterns the policy is measured with write every byte once).
//! It holds at most `entries_max` partly written blocks: past that it starts afresh, and the
//! blocks it forgot are written back by the ordinary policy.

use crate::block_cache::{BlockCache, BlockKey, Placement, WritebackItem};
use crate::extent::Extent;
use crate::writeback::write_back;
use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

/// Batches of full blocks waiting for the write-back thread; past this they wait for the
/// ordinary policy instead.
pub const WRITE_FULL_QUEUE_MAX: usize = 256;

/// Bytes written into each partly written block.
#[derive(Debug)]
pub struct Coverage {
    written: HashMap<BlockKey, u64>,
    entries_max: usize,
}

impl Coverage {
    pub fn new(entries_max: usize) -> Coverage {
        Coverage { written: HashMap::new(), entries_max: entries_max.max(1) }
    }

    /// Counts a write of `extents` to fork `fork_serial`; returns the blocks it filled.
    pub fn record(&mut self, fork_serial: u64, extents: &[Extent], block_bytes: u64) -> Vec<u64> {
        let mut full = Vec::new();
        for extent in extents {
            let (mut at, end) = (extent.offset, extent.offset.saturating_add(extent.length));
            while at < end {
                let block = at / block_bytes;
                let piece = (block * block_bytes + block_bytes).min(end) - at;
                let key = BlockKey { fork_serial, block };
                let total = self.written.get(&key).copied().unwrap_or(0) + piece;
                if total >= block_bytes {
                    self.written.remove(&key);
                    full.push(block);
                } else {
                    if self.written.len() >= self.entries_max {
                        self.written.clear();
                    }
                    self.written.insert(key, total);
                }
                at += piece;
            }
        }
        full
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.written.len()
    }
}

/// The policy's state in a store: the coverage and the write-back thread's queue.
#[derive(Debug)]
pub(crate) struct WriteFull {
    coverage: parking_lot::Mutex<Coverage>,
    queue: SyncSender<Vec<WritebackItem>>,
}

impl WriteFull {
    /// Starts the write-back thread (it ends when the store drops its `WriteFull`).
    pub(crate) fn start(cache: Arc<BlockCache>, entries_max: usize) -> std::io::Result<WriteFull> {
        let (queue, batches) = sync_channel::<Vec<WritebackItem>>(WRITE_FULL_QUEUE_MAX);
        std::thread::Builder::new().name("flotilla-write-full".into()).spawn(move || {
            for items in batches {
                if let Err(error) = write_back(&cache, items, Placement::Hot) {
                    tracing::warn!(%error, "writing back full blocks failed; they stay dirty");
                }
            }
        })?;
        Ok(WriteFull { coverage: parking_lot::Mutex::new(Coverage::new(entries_max)), queue })
    }

    /// After a write of `extents` to fork `fork_serial`: hands the blocks it filled to the
    /// write-back thread.
    pub(crate) fn wrote(&self, cache: &BlockCache, fork_serial: u64, extents: &[Extent], block_bytes: u64) {
        let full = self.coverage.lock().record(fork_serial, extents, block_bytes);
        if full.is_empty() {
            return;
        }
        let items = cache.take_dirty_blocks(fork_serial, &full);
        if items.is_empty() {
            return;
        }
        if let Err(TrySendError::Full(items) | TrySendError::Disconnected(items)) = self.queue.try_send(items)
        {
            // The thread is behind: the blocks go back to the ordinary policy.
            for item in &items {
                item.fork.writeback_finished();
            }
            cache.finish_writeback(items, false, Placement::Hot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_block_is_full_once_every_byte_was_written() {
        let mut coverage = Coverage::new(16);
        assert!(coverage.record(1, &[Extent::new(0, 100)], 512).is_empty());
        assert!(coverage.record(1, &[Extent::new(100, 400)], 512).is_empty());
        assert_eq!(coverage.record(1, &[Extent::new(500, 12 + 512 + 10)], 512), vec![0, 1]);
        assert_eq!(coverage.len(), 1, "block 2 holds 10 bytes");
        assert!(coverage.record(2, &[Extent::new(1024, 502)], 512).is_empty(), "another fork's block 2");
    }

    #[test]
    fn forgets_everything_past_its_bound() {
        let mut coverage = Coverage::new(2);
        for block in 0..5 {
            coverage.record(1, &[Extent::new(block * 512, 10)], 512);
        }
        assert!(coverage.len() <= 2);
    }

    /// Writes three whole 4 KiB blocks and half of a fourth in 512-byte records; returns the
    /// blocks written to disk and the dirty bytes once the write-back settled (or after 10 s).
    fn write_records(write_full: bool) -> (u64, u64) {
        use crate::{ForkRef, Store, StoreConfig};
        use flotilla_types::{FileId, SubfileIndex};
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::new(vec![dir.path().to_path_buf()], true);
        config.block_bytes = 4096;
        config.cache_capacity_bytes = 64 * 4096;
        config.write_full = write_full;
        let store = Store::open(config).unwrap();
        let target = store.target_ids()[0];
        store.create_subfile(target, FileId(3), SubfileIndex(0)).unwrap();
        let fork = ForkRef::new(target, FileId(3), SubfileIndex(0), "data");
        for record in 0..(3 * 8 + 4) {
            store.write(&fork, &[Extent::new(record * 512, 512)], &[record as u8; 512]).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let stats = store.stats();
            let settled = stats.disk_write_blocks >= 3 || !write_full;
            if settled || std::time::Instant::now() > deadline {
                return (stats.disk_write_blocks, stats.dirty_bytes);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn full_blocks_go_to_disk_without_a_sync_and_the_partial_one_waits() {
        assert_eq!(write_records(true), (3, 4096));
        assert_eq!(write_records(false), (0, 4 * 4096), "write-back holds every block");
    }

    proptest! {
        #[test]
        fn writing_a_range_record_by_record_fills_each_block_once(
            records in 1u64..200, record_bytes in 1u64..3000, block_shift in 9u32..14
        ) {
            let block_bytes = 1u64 << block_shift;
            let mut coverage = Coverage::new(1 << 20);
            let mut full = Vec::new();
            for record in 0..records {
                full.extend(coverage.record(7, &[Extent::new(record * record_bytes, record_bytes)], block_bytes));
            }
            let end = records * record_bytes;
            let expected: Vec<u64> = (0..end / block_bytes).collect();
            full.sort_unstable();
            prop_assert_eq!(full, expected);
        }
    }
}
