//! Settings of a [`Store`](crate::Store). Every queue, cache and limit the engine has is
//! bounded by one of these; `validate` refuses combinations that cannot work.

use crate::error::StoreError;
use std::path::PathBuf;

/// Smallest and largest allowed cache block.
pub const BLOCK_BYTES_MIN: u64 = 512;
pub const BLOCK_BYTES_MAX: u64 = 16 << 20;
/// The cache must hold at least this many blocks.
pub const CACHE_BLOCKS_MIN: u64 = 4;

/// Most disk threads a target may have (`disk_threads_per_target`).
pub const DISK_THREADS_PER_TARGET_MAX: usize = 64;

/// Most cache shards (`cache_shards`): a window's shards fit in a 64-bit mask.
pub const CACHE_SHARDS_MAX: usize = 64;
/// Default of `cache_shards`: twice the default worker threads of a server (4), so two
/// requests hitting random blocks meet on a shard one time in eight. It is an upper bound:
/// caches too small for 8 shards with windows of half the cache or 64 MiB get fewer (the
/// default 64 MiB store cache 2, a server's default 256 MiB cache 4, 512 MiB and up 8).
pub const CACHE_SHARDS_DEFAULT: usize = 8;

/// Default of `bulk_bytes_min`: a stripe unit of the default layout, eight default blocks.
pub const BULK_BYTES_MIN_DEFAULT: u64 = 256 << 10;

/// How to open a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Target specs, each naming a directory that must exist: `DIR` or `dir:DIR` (kind
    /// `dir`), or `sim:MODEL:DIR` (kind `sim`: `hp97560` or `st31200n`, see `SimModel`).
    pub targets: Vec<PathBuf>,
    /// Write the target id file into a target directory that has none yet.
    pub init: bool,
    /// Cache block size: a power of two in `BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX`.
    pub block_bytes: u64,
    /// Memory of the buffer cache; holds `cache_capacity_bytes / block_bytes` blocks.
    pub cache_capacity_bytes: u64,
    /// Most block operations queued at one target's disk scheduler.
    pub disk_queue_max: usize,
    /// Largest coalesced disk transfer (adjacent blocks of one fork).
    pub disk_run_bytes_max: u64,
    /// Disk threads serving each `dir` target's queue, so transfers in flight at once (queue
    /// depth), in `1..=DISK_THREADS_PER_TARGET_MAX`. `sim` and `lines` targets always have
    /// one: a simulated disk has one arm, and a lines image moves its blocks under one lock.
    pub disk_threads_per_target: usize,
    /// Shards of the cache index (`block_cache`), each with its own mutex: a power of two in
    /// `1..=CACHE_SHARDS_MAX`, at most. A request window pins at most one shard's slots (and
    /// at most half the cache), so fewer shards are used when the cache is small: each shard
    /// keeps at least 64 slots (or half the cache) and a window at least 64 MiB (or half the
    /// cache), as large as before sharding for every request up to the default
    /// `request_bytes_max`.
    pub cache_shards: usize,
    /// Most fork files kept open at once, over all targets.
    pub fd_cache_max: usize,
    /// Largest fork size; a request ending past it is refused.
    pub fork_bytes_max: u64,
    /// `flush_aged` also writes back the oldest dirty blocks while the cache holds more dirty
    /// bytes than this, until it holds at most half of it.
    pub dirty_bytes_high_max: u64,
    /// Most fdatasyncs `sync_many` and `flush_all` run at once (one thread each).
    pub sync_threads_max: usize,
    /// The WriteFull policy: a block goes to disk as soon as writes covered all of it
    /// (`write_full.rs`).
    pub write_full: bool,
    /// Ask for the cache's memory in transparent huge pages (`arena.rs`); a hint the kernel
    /// may ignore.
    pub cache_huge_pages: bool,
    /// A piece of a request covering at least this many bytes of whole cache blocks on a
    /// `dir` target goes straight between the request's buffer and the fork file (through
    /// the kernel's page cache only, not the store's cache; `bulk.rs`); 0: never.
    pub bulk_bytes_min: u64,
    /// The tertiary tier every lines target of the store uses (`None`: no archive).
    pub tier: Option<crate::tier::TierConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            targets: Vec::new(),
            init: false,
            block_bytes: 32 << 10,
            cache_capacity_bytes: 64 << 20,
            disk_queue_max: 4096,
            disk_run_bytes_max: 1 << 20,
            disk_threads_per_target: 1,
            cache_shards: CACHE_SHARDS_DEFAULT,
            fd_cache_max: 256,
            fork_bytes_max: 1 << 50,
            dirty_bytes_high_max: 32 << 20,
            sync_threads_max: 16,
            write_full: false,
            cache_huge_pages: true,
            bulk_bytes_min: BULK_BYTES_MIN_DEFAULT,
            tier: None,
        }
    }
}

impl StoreConfig {
    /// Default settings for the given target directories.
    pub fn new(targets: Vec<PathBuf>, init: bool) -> Self {
        Self { targets, init, ..Self::default() }
    }

    /// Number of blocks the cache holds.
    pub fn cache_blocks(&self) -> u64 {
        self.cache_capacity_bytes / self.block_bytes.max(1)
    }

    /// Checks that the settings can work together.
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |name, reason: String| Err(StoreError::BadConfig { name, reason });
        if self.targets.is_empty() {
            return bad("targets", "must name at least one target directory".into());
        }
        if !self.block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&self.block_bytes)
        {
            return bad(
                "block_bytes",
                format!(
                    "({}) must be a power of two in {BLOCK_BYTES_MIN}..={BLOCK_BYTES_MAX}",
                    self.block_bytes
                ),
            );
        }
        let blocks = self.cache_blocks();
        if !(CACHE_BLOCKS_MIN..u64::from(u32::MAX - 2)).contains(&blocks) {
            return bad(
                "cache_capacity_bytes",
                format!(
                    "({}) must hold between {CACHE_BLOCKS_MIN} and 2^32-3 blocks of {} bytes",
                    self.cache_capacity_bytes, self.block_bytes
                ),
            );
        }
        self.validate_counts()
    }

    fn validate_counts(&self) -> Result<(), StoreError> {
        let bad = |name, reason: String| Err(StoreError::BadConfig { name, reason });
        if self.disk_queue_max == 0 {
            return bad("disk_queue_max", "must be at least 1".into());
        }
        if !(1..=DISK_THREADS_PER_TARGET_MAX).contains(&self.disk_threads_per_target) {
            return bad(
                "disk_threads_per_target",
                format!("({}) must be in 1..={DISK_THREADS_PER_TARGET_MAX}", self.disk_threads_per_target),
            );
        }
        if !self.cache_shards.is_power_of_two() || self.cache_shards > CACHE_SHARDS_MAX {
            return bad(
                "cache_shards",
                format!("({}) must be a power of two in 1..={CACHE_SHARDS_MAX}", self.cache_shards),
            );
        }
        if self.sync_threads_max == 0 {
            return bad("sync_threads_max", "must be at least 1".into());
        }
        if self.fd_cache_max == 0 {
            return bad("fd_cache_max", "must be at least 1".into());
        }
        if self.disk_run_bytes_max < self.block_bytes {
            return bad("disk_run_bytes_max", format!("must be at least block_bytes ({})", self.block_bytes));
        }
        if self.fork_bytes_max == 0 || self.fork_bytes_max > 1 << 62 {
            return bad("fork_bytes_max", "must be in 1..=2^62".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_with_a_target_is_valid() {
        let config = StoreConfig::new(vec!["/tmp/x".into()], false);
        assert!(config.validate().is_ok());
        assert_eq!(config.cache_blocks(), 2048);
    }

    #[test]
    fn refuses_bad_block_size_and_tiny_cache() {
        let mut config = StoreConfig::new(vec!["/tmp/x".into()], false);
        config.block_bytes = 3000;
        assert!(matches!(config.validate(), Err(StoreError::BadConfig { name: "block_bytes", .. })));
        config.block_bytes = 4096;
        config.cache_capacity_bytes = 4096 * 3;
        assert!(matches!(config.validate(), Err(StoreError::BadConfig { name: "cache_capacity_bytes", .. })));
    }

    /// Sets `name` to each value of `cases` through `set` and checks that `validate`
    /// accepts the valid ones and refuses the others naming `name`.
    fn check_setting(name: &str, cases: &[(usize, bool)], set: impl Fn(&mut StoreConfig, usize)) {
        let mut config = StoreConfig::new(vec!["/tmp/x".into()], false);
        for &(value, valid) in cases {
            set(&mut config, value);
            let result = config.validate();
            match valid {
                true => assert!(result.is_ok(), "{name} = {value}"),
                false => assert!(
                    matches!(&result, Err(StoreError::BadConfig { name: refused, .. }) if *refused == name),
                    "{name} = {value}: {result:?}"
                ),
            }
        }
    }

    #[test]
    fn cache_shards_must_be_a_power_of_two_up_to_the_maximum() {
        let cases = [(0, false), (1, true), (2, true), (3, false), (8, true), (64, true), (128, false)];
        check_setting("cache_shards", &cases, |config, shards| config.cache_shards = shards);
    }

    #[test]
    fn disk_threads_per_target_must_be_between_one_and_the_maximum() {
        let cases = [(0, false), (1, true), (DISK_THREADS_PER_TARGET_MAX, true), (65, false)];
        check_setting("disk_threads_per_target", &cases, |config, threads| {
            config.disk_threads_per_target = threads
        });
    }
}
