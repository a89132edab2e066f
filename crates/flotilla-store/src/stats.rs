//! Counters of cache and disk activity, for tests and benchmarks.
//!
//! The counters are relaxed atomics bumped on the hot paths; `StoreStats` is a snapshot.
//! Counts are monotonic except the two gauges `dirty_bytes` and `cached_bytes`.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the store's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Distinct blocks a request found in the cache.
    pub cache_hits: u64,
    /// Distinct blocks a request did not find in the cache.
    pub cache_misses: u64,
    /// Clean blocks dropped from the cache to make room.
    pub evictions: u64,
    /// Read system calls (each may cover several adjacent blocks; bulk pieces included).
    pub disk_reads: u64,
    pub disk_read_blocks: u64,
    pub disk_read_bytes: u64,
    /// Write system calls (each may cover several adjacent blocks; bulk pieces included).
    pub disk_writes: u64,
    pub disk_write_blocks: u64,
    pub disk_write_bytes: u64,
    /// Space reservations (fallocate) made for growing forks.
    pub reservations: u64,
    /// fdatasync calls.
    pub disk_syncs: u64,
    /// Disk scheduler transfers that began while another transfer of the same target was in
    /// flight (never with one disk thread per target): how often queue depth > 1 was used.
    pub disk_runs_overlapped: u64,
    /// Checksum blocks read from disk whose bytes did not match their stored CRC32C.
    pub checksum_errors: u64,
    pub read_requests: u64,
    pub read_bytes: u64,
    pub write_requests: u64,
    pub write_bytes: u64,
    /// Bulk pieces read straight from fork files, past the cache (`bulk_bytes_min`), and
    /// their bytes below the end of the fork (also counted in `disk_reads`/`disk_read_bytes`;
    /// the `disk_*_blocks` counters count cache blocks only).
    pub bulk_reads: u64,
    pub bulk_read_bytes: u64,
    /// Bulk pieces written straight to fork files, past the cache, and their bytes (also in
    /// `disk_writes`/`disk_write_bytes`).
    pub bulk_writes: u64,
    pub bulk_write_bytes: u64,
    /// Times a thread found a cache shard's mutex held and had to wait for it (lock
    /// contention of the cache index; `cache_shards`).
    pub cache_lock_waits: u64,
    /// Gauge: bytes of dirty blocks in the cache.
    pub dirty_bytes: u64,
    /// Gauge: bytes of blocks holding data in the cache.
    pub cached_bytes: u64,
}

impl StoreStats {
    /// The counters' growth since `earlier` (gauges are taken from `self`).
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        StoreStats {
            cache_hits: self.cache_hits.saturating_sub(earlier.cache_hits),
            cache_misses: self.cache_misses.saturating_sub(earlier.cache_misses),
            evictions: self.evictions.saturating_sub(earlier.evictions),
            disk_reads: self.disk_reads.saturating_sub(earlier.disk_reads),
            disk_read_blocks: self.disk_read_blocks.saturating_sub(earlier.disk_read_blocks),
            disk_read_bytes: self.disk_read_bytes.saturating_sub(earlier.disk_read_bytes),
            disk_writes: self.disk_writes.saturating_sub(earlier.disk_writes),
            disk_write_blocks: self.disk_write_blocks.saturating_sub(earlier.disk_write_blocks),
            disk_write_bytes: self.disk_write_bytes.saturating_sub(earlier.disk_write_bytes),
            reservations: self.reservations.saturating_sub(earlier.reservations),
            disk_syncs: self.disk_syncs.saturating_sub(earlier.disk_syncs),
            disk_runs_overlapped: self.disk_runs_overlapped.saturating_sub(earlier.disk_runs_overlapped),
            checksum_errors: self.checksum_errors.saturating_sub(earlier.checksum_errors),
            read_requests: self.read_requests.saturating_sub(earlier.read_requests),
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            write_requests: self.write_requests.saturating_sub(earlier.write_requests),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
            bulk_reads: self.bulk_reads.saturating_sub(earlier.bulk_reads),
            bulk_read_bytes: self.bulk_read_bytes.saturating_sub(earlier.bulk_read_bytes),
            bulk_writes: self.bulk_writes.saturating_sub(earlier.bulk_writes),
            bulk_write_bytes: self.bulk_write_bytes.saturating_sub(earlier.bulk_write_bytes),
            cache_lock_waits: self.cache_lock_waits.saturating_sub(earlier.cache_lock_waits),
            dirty_bytes: self.dirty_bytes,
            cached_bytes: self.cached_bytes,
        }
    }
}

/// The live counters behind `StoreStats`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub evictions: AtomicU64,
    pub disk_reads: AtomicU64,
    pub disk_read_blocks: AtomicU64,
    pub disk_read_bytes: AtomicU64,
    pub disk_writes: AtomicU64,
    pub disk_write_blocks: AtomicU64,
    pub disk_write_bytes: AtomicU64,
    pub reservations: AtomicU64,
    pub disk_syncs: AtomicU64,
    pub disk_runs_overlapped: AtomicU64,
    pub checksum_errors: AtomicU64,
    pub read_requests: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_requests: AtomicU64,
    pub write_bytes: AtomicU64,
    pub bulk_reads: AtomicU64,
    pub bulk_read_bytes: AtomicU64,
    pub bulk_writes: AtomicU64,
    pub bulk_write_bytes: AtomicU64,
    pub cache_lock_waits: AtomicU64,
}

/// Adds `amount` to a counter.
pub(crate) fn bump(counter: &AtomicU64, amount: u64) {
    counter.fetch_add(amount, Ordering::Relaxed);
}

impl Counters {
    /// Snapshot of the counters plus the cache's gauges.
    pub(crate) fn snapshot(&self, dirty_bytes: u64, cached_bytes: u64) -> StoreStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StoreStats {
            cache_hits: get(&self.cache_hits),
            cache_misses: get(&self.cache_misses),
            evictions: get(&self.evictions),
            disk_reads: get(&self.disk_reads),
            disk_read_blocks: get(&self.disk_read_blocks),
            disk_read_bytes: get(&self.disk_read_bytes),
            disk_writes: get(&self.disk_writes),
            disk_write_blocks: get(&self.disk_write_blocks),
            disk_write_bytes: get(&self.disk_write_bytes),
            reservations: get(&self.reservations),
            disk_syncs: get(&self.disk_syncs),
            disk_runs_overlapped: get(&self.disk_runs_overlapped),
            checksum_errors: get(&self.checksum_errors),
            read_requests: get(&self.read_requests),
            read_bytes: get(&self.read_bytes),
            write_requests: get(&self.write_requests),
            write_bytes: get(&self.write_bytes),
            bulk_reads: get(&self.bulk_reads),
            bulk_read_bytes: get(&self.bulk_read_bytes),
            bulk_writes: get(&self.bulk_writes),
            bulk_write_bytes: get(&self.bulk_write_bytes),
            cache_lock_waits: get(&self.cache_lock_waits),
            dirty_bytes,
            cached_bytes,
        }
    }
}
