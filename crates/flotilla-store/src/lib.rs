//! `flotilla-store`: the I/O server's storage engine (no networking).
//!
//! It keeps the forks of subfiles on storage targets and executes extent lists through a
//! buffer cache and one disk scheduler per target, after Galley's I/O processor (CP threads,
//! CacheManager, DiskManager; Nieuwejaar and Kotz, section 4.2).
//!
//! Layers, each depending only on those below it:
//! - [`Store`] — the API the server's worker threads call (`&self`, `Send + Sync`, blocking).
//! - `request` — one read or write: extents to blocks a window at a time (`window`), pin,
//!   submit all misses at once, copy in extent order. `bulk` — on `dir` targets, pieces of
//!   at least `bulk_bytes_min` whole blocks go straight to and from the fork file instead.
//! - `block_cache` — index and replacement (hash index, clean LRU, dirty FIFO, pins), in
//!   `cache_shards` shards with a mutex each (`cache_shard`) plus the bulk gates
//!   (`cache_gates`); bytes live in `slot_pool`, which is also all the disk threads see.
//! - `disk_manager` — a bounded pool of threads per target (`disk_threads_per_target`; one
//!   for `sim` and `lines`) serving `disk_queue` in C-SCAN order, coalescing adjacent blocks
//!   into one vectored system call, never moving one block on two threads at once.
//! - `target` / [`ForkBackend`] — the on-disk layout and raw block I/O; the `dir` kind is
//!   [`FileFork`], the `sim` kind [`SimFork`] (a `FileFork` timed as a 1990s disk:
//!   `sim_model`, `sim_disk`, `sim_target`). Formats are described in `docs/target-format.md`.
//! - `checksum` — per-block CRC32C of fork data: computed by the disk thread on write-back,
//!   stored in each fork's checksum file, checked right after every read from disk.
//! - `crash_fork` (feature `test-support`) — `CrashDisk`/`CrashFork`, the `crash:DIR` kind:
//!   fork bytes in memory with a seeded power loss that drops or tears unsynced writes.
//!
//! Limits: cache memory (`cache_capacity_bytes`), disk queue (`disk_queue_max`), disk
//! threads (`disk_threads_per_target`), coalesced
//! transfer (`disk_run_bytes_max`), open files (`fd_cache_max`), fork size
//! (`fork_bytes_max`), cache shards (`cache_shards`); a request pins at most half the cache,
//! and at most one shard's slots, at once.

mod arena;
mod backend;
mod block_cache;
mod bulk;
mod cache_gates;
mod cache_shard;
mod checksum;
mod completion;
mod config;
#[cfg(feature = "test-support")]
mod crash_fork;
mod disk_manager;
mod disk_queue;
mod error;
mod extent;
mod fd_cache;
mod file_fork;
mod fork;
mod fork_ref;
mod fork_table;
mod lines_disk;
mod lines_fork;
mod lines_format;
mod lines_image;
mod lines_map;
mod lru_list;
mod prefetch;
#[cfg(test)]
mod prefetch_tests;
mod request;
mod reserved;
mod sim_disk;
mod sim_fork;
mod sim_model;
mod sim_target;
mod slot_pool;
mod stats;
mod store;
#[cfg(test)]
mod store_tests;
mod target;
mod target_id_file;
mod target_runtime;
mod tier;
mod tier_record;
#[cfg(test)]
mod tier_tests;
mod window;
mod write_full;
mod writeback;

pub use backend::ForkBackend;
pub use checksum::CHECKSUM_ENTRY_BYTES;
pub use config::{
    StoreConfig, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, BULK_BYTES_MIN_DEFAULT, CACHE_BLOCKS_MIN,
    CACHE_SHARDS_DEFAULT, CACHE_SHARDS_MAX, DISK_THREADS_PER_TARGET_MAX,
};
#[cfg(feature = "test-support")]
pub use crash_fork::{CrashDisk, CrashFork, PowerLossReport, CRASH_SECTOR_BYTES};
pub use error::StoreError;
pub use extent::Extent;
pub use file_fork::FileFork;
pub use fork_ref::ForkRef;
pub use lines_disk::{
    format as format_lines_image, is_block_device, set_simulated_clock_s, LinesDisk,
    Recovery as LinesRecovery, LINES_IMAGE_NAME,
};
pub use lines_format::{BlockState, ForkKey, Geometry as LinesGeometry};
pub use prefetch::{Declined, PendingLoads, Prefetch, ReadOrPrefetch};
pub use sim_disk::SimDisk;
pub use sim_fork::SimFork;
pub use sim_model::{
    PublishedFigures, SimModel, SimModelError, SIM_LAYOUT_BLOCK_BYTES_DEFAULT, SIM_SECTOR_BYTES,
};
pub use sim_target::{LinesOptions, TargetKind, TargetSpec, SIM_REGIONS_MAX, SIM_REGION_BYTES_MIN};
pub use stats::StoreStats;
pub use store::{BlockCheck, Store, TierPass};
pub use target::{Target, TargetUsage, CHECKSUMS_DIR_NAME, DEFAULT_FORK_NAME, SUBFILES_DIR_NAME};
pub use target_id_file::{
    CHECKSUM_BLOCK_BYTES_DEFAULT, CHECKSUM_BLOCK_BYTES_MAX, CHECKSUM_BLOCK_BYTES_MIN, TARGET_FORMAT_VERSION,
    TARGET_ID_FILE_NAME,
};
pub use tier::{reclaim_wanted, HsmAction, HsmState, Residency, TierConfig, TierPolicy, TierStats};
pub use tier_record::ArchiveRecord;
