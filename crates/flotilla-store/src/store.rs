//! The storage engine's entry point: what the I/O server's worker threads call.
//!
//! All operations take `&self` and may run concurrently from many threads; each blocks
//! until done. A read or write request is validated whole before any block is touched, and a
//! write that grows a fork reserves the space first, so it either fails with nothing applied
//! or is applied and its later write-back cannot run out of space; it reserves the blocks it
//! touches, not the span between its extents, so holes stay holes.
//!
//! Bulk pieces (`bulk_bytes_min` or more of whole blocks, `dir` targets) go straight to and
//! from the fork files instead (`bulk`), under the same durability contract.
//!
//! Durability: writes land in the buffer cache; `sync` (one fork), `sync_many` (several, the
//! fdatasyncs overlapped) and `flush_all` (everything) write dirty blocks back and fdatasync
//! data and checksum files. `flush_aged` writes back without syncing. Dropping
//! the store runs `flush_all` and logs a failure.

use crate::block_cache::{cache_geometry, BlockCache, Placement, SHARD_SLOTS_MIN, WINDOW_BYTES_MIN};
use crate::bulk::{self, Segment};
use crate::config::StoreConfig;
use crate::disk_manager::{DiskLimits, DiskManager};
use crate::error::StoreError;
use crate::extent::{summarize, Extent};
use crate::fd_cache::FdCache;
use crate::fork::{Fork, ForkContext};
use crate::fork_ref::ForkRef;
use crate::prefetch::{self, PinBudget, Prefetch, PrefetchContext, ReadOrPrefetch};
use crate::request::{self, RequestEngine};
use crate::sim_target::{TargetKind, TargetSpec};
use crate::slot_pool::SlotPool;
use crate::stats::{bump, Counters, StoreStats};
use crate::target::{Target, TargetUsage};
use crate::target_id_file::CHECKSUM_BLOCK_BYTES_DEFAULT;
use crate::target_runtime::TargetRuntime;
use crate::tier::{HsmAction, HsmState, TierStats};
use crate::write_full::WriteFull;
use crate::writeback::write_back;
use flotilla_types::{FileId, SubfileIndex, TargetId};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one pass of a migration manager did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierPass {
    pub archived_forks: u64,
    pub failures: u64,
    pub reclaimed_blocks: u64,
}

/// The storage engine of one I/O server.
#[path = "store_scrub.rs"]
mod scrub;
pub use scrub::BlockCheck;

#[derive(Debug)]
pub struct Store {
    config: StoreConfig,
    counters: Arc<Counters>,
    cache: Arc<BlockCache>,
    /// The WriteFull policy, when configured.
    write_full: Option<WriteFull>,
    fds: Arc<FdCache>,
    targets: Vec<TargetRuntime>,
    window_blocks_max: usize,
    block_shift: u32,
    /// Bounds the blocks prefetches keep pinned (`prefetch`).
    prefetch_budget: PinBudget,
}

impl Store {
    /// Opens every target (each a spec: `DIR`, `dir:DIR` or `sim:MODEL:DIR`) and starts each
    /// target's disk scheduler threads (`disk_threads`).
    pub fn open(config: StoreConfig) -> Result<Store, StoreError> {
        let window_blocks_min = (WINDOW_BYTES_MIN / config.block_bytes.max(1)) as usize;
        Self::open_with_geometry(config, (SHARD_SLOTS_MIN, window_blocks_min))
    }

    /// `open` with each cache shard keeping at least `shard_slots_min` slots (or half the
    /// cache); tests use small values to get many shards out of tiny caches.
    /// Windows are not kept at `WINDOW_BYTES_MIN` there.
    #[cfg(test)]
    pub(crate) fn open_sharded(config: StoreConfig, shard_slots_min: usize) -> Result<Store, StoreError> {
        Self::open_with_geometry(config, (shard_slots_min, 1))
    }

    /// `open` with each shard keeping at least `shard_slots_min` slots and each window
    /// `window_blocks_min` blocks (or half the cache), see `cache_geometry`.
    fn open_with_geometry(
        config: StoreConfig,
        (shard_slots_min, window_blocks_min): (usize, usize),
    ) -> Result<Store, StoreError> {
        config.validate()?;
        let counters = Arc::new(Counters::default());
        let cache_blocks = config.cache_blocks() as usize;
        let pool = SlotPool::new(cache_blocks, config.block_bytes as usize, config.cache_huge_pages)
            .map_err(|error| StoreError::io("map the cache's memory", error))?;
        let pool = Arc::new(pool);
        let geometry =
            cache_geometry(cache_blocks, config.cache_shards, (shard_slots_min, window_blocks_min));
        let cache = Arc::new(BlockCache::new(pool.clone(), counters.clone(), geometry.shards));
        let write_full = match config.write_full {
            true => Some(
                WriteFull::start(cache.clone(), cache_blocks)
                    .map_err(|error| StoreError::io("start the write-full thread", error))?,
            ),
            false => None,
        };
        let fds = Arc::new(FdCache::new(config.fd_cache_max));
        let limits = DiskLimits {
            queue_ops_max: config.disk_queue_max,
            run_blocks_max: (config.disk_run_bytes_max / config.block_bytes) as usize,
            gather_reads: false,
            threads: 1,
        };
        let mut targets: Vec<TargetRuntime> = Vec::with_capacity(config.targets.len());
        for dir in &config.targets {
            let new_checksum_block_bytes = config.block_bytes.min(CHECKSUM_BLOCK_BYTES_DEFAULT);
            let mut target =
                Target::open_spec(&TargetSpec::parse(dir)?, config.init, new_checksum_block_bytes)?;
            if let Some(tier) = &config.tier {
                if target.lines_disk().is_some() {
                    target.attach_tier(tier)?;
                }
            }
            check_checksum_block(&config, &target)?;
            if let Some(other) = targets.iter().find(|other| other.target().id() == target.id()) {
                return Err(StoreError::DuplicateTarget {
                    target: target.id(),
                    first: other.target().dir().to_path_buf(),
                    second: dir.clone(),
                });
            }
            let name = format!("flotilla-disk-{:04x}", target.id().0 & 0xffff);
            let gather_reads = matches!(target.kind(), TargetKind::Lines(options) if options.gather_reads);
            let threads = disk_threads(&config, target.kind());
            let limits = DiskLimits { gather_reads, threads, ..limits };
            let disk = DiskManager::start(name, pool.clone(), counters.clone(), limits)?;
            targets.push(TargetRuntime::new(ForkContext {
                target: Arc::new(target),
                disk,
                fds: fds.clone(),
                unsynced_closed: Arc::new(Mutex::new(HashSet::new())),
            }));
        }
        let window_blocks_max = geometry.window_blocks_max;
        Ok(Store {
            block_shift: config.block_bytes.trailing_zeros(),
            window_blocks_max,
            // A request waiting for room always finds one window's worth once the running
            // requests unpin, however many blocks prefetches hold (`pin_if_room` also keeps
            // one window's worth of every shard unpinned by prefetches).
            prefetch_budget: PinBudget::new(cache_blocks - window_blocks_max),
            config,
            counters,
            cache,
            write_full,
            fds,
            targets,
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Ids of the targets, in the order of `config.targets`.
    pub fn target_ids(&self) -> Vec<TargetId> {
        self.targets.iter().map(|runtime| runtime.target().id()).collect()
    }

    /// Directory of a target.
    pub fn target_dir(&self, target: TargetId) -> Result<&Path, StoreError> {
        Ok(self.any_runtime(target)?.target().dir())
    }

    /// Why a target counts as having lost its contents, if it does (`Target::lost`); such a
    /// target is reported but refuses every request (`StoreError::TargetLost`).
    pub fn target_lost(&self, target: TargetId) -> Result<Option<String>, StoreError> {
        Ok(self.any_runtime(target)?.target().lost().map(str::to_string))
    }

    /// The runtime of a target that may serve requests: `TargetLost` if it lost its contents.
    fn runtime(&self, target: TargetId) -> Result<&TargetRuntime, StoreError> {
        let runtime = self.any_runtime(target)?;
        runtime.target().check_whole()?;
        Ok(runtime)
    }

    /// The runtime of a target, lost or not (for reports about it).
    fn any_runtime(&self, target: TargetId) -> Result<&TargetRuntime, StoreError> {
        self.targets
            .iter()
            .find(|runtime| runtime.target().id() == target)
            .ok_or(StoreError::UnknownTarget { target })
    }

    fn fork(&self, fork: &ForkRef<'_>) -> Result<Arc<Fork>, StoreError> {
        self.runtime(fork.target)?.fork(fork)
    }

    fn engine(&self) -> RequestEngine<'_> {
        RequestEngine {
            cache: &self.cache,
            window_blocks_max: self.window_blocks_max,
            block_shift: self.block_shift,
        }
    }

    /// Reads the extents into `out` (whose length must be the extents' total), packed in
    /// extent order. Bytes past the end of the fork read as zeros.
    pub fn read(&self, fork: &ForkRef<'_>, extents: &[Extent], out: &mut [u8]) -> Result<(), StoreError> {
        summarize(extents, fork, self.config.fork_bytes_max, out.len())?;
        let live = self.fork(fork)?;
        let _shared = live.lock_shared()?;
        match self.bulk_segments(&live, extents) {
            None => request::read(self.engine(), &live, extents, out)?,
            Some(segments) => {
                for segment in segments {
                    match segment {
                        Segment::Cache { extents, data } => {
                            request::read(self.engine(), &live, &extents, &mut out[data])?
                        }
                        Segment::Bulk { extent, data } => {
                            bulk::read(self.engine(), &self.counters, &live, extent, &mut out[data])?
                        }
                    }
                }
            }
        }
        bump(&self.counters.read_requests, 1);
        bump(&self.counters.read_bytes, out.len() as u64);
        Ok(())
    }

    /// Starts the disk reads a `read` (or, `writing`, a `write`) of `extents` will need,
    /// without waiting for them or for room in the cache: `Ready` if every block is cached,
    /// `Pending` with a handle that pins the blocks and calls back when their loads
    /// finished, or `Declined` (nothing pinned) when the request is not one window, has
    /// bulk pieces, or the cache has no room now. Nothing is written; the request itself
    /// still runs through `read`/`write`, which then finds its blocks cached. Drop the
    /// handle once its loads finished: a truncate or removal of the fork waits for its pins.
    pub fn prefetch(
        &self,
        fork: &ForkRef<'_>,
        extents: &[Extent],
        writing: bool,
    ) -> Result<Prefetch, StoreError> {
        let started = self.before_prefetch(fork, extents, |context, live, total_bytes| {
            prefetch::start(context, live, extents, total_bytes, writing)
        })?;
        Ok(started.unwrap_or(Prefetch::Declined(prefetch::Declined::Bulk)))
    }

    /// A `read` if every block of the extents is cached (`Read`, with the buffer `buffer`
    /// made for the extents' total length, filled), else `prefetch`'s start of its disk
    /// reads (`Pending`, or `Declined`, after which run `read`). One planning and pinning of
    /// the request's window serves both the check and the copy; the buffer is asked for only
    /// when the read runs.
    pub fn read_or_prefetch<B: AsMut<[u8]>>(
        &self,
        fork: &ForkRef<'_>,
        extents: &[Extent],
        buffer: impl FnOnce(usize) -> B,
    ) -> Result<ReadOrPrefetch<B>, StoreError> {
        let started = self.before_prefetch(fork, extents, |context, live, total_bytes| {
            let outcome = prefetch::start_read(context, live, (extents, total_bytes), buffer)?;
            if matches!(outcome, ReadOrPrefetch::Read(_)) {
                bump(&self.counters.read_requests, 1);
                bump(&self.counters.read_bytes, total_bytes as u64);
            }
            Ok(outcome)
        })?;
        Ok(started.unwrap_or(ReadOrPrefetch::Declined(prefetch::Declined::Bulk)))
    }

    /// What `prefetch` and `read_or_prefetch` do first: the extents checked (total length,
    /// fork size bound), the fork found and held shared, then `start` with the prefetch's
    /// context, the live fork and the extents' total; `None` when bulk pieces make the
    /// request go past the cache (declined).
    fn before_prefetch<T>(
        &self,
        fork: &ForkRef<'_>,
        extents: &[Extent],
        start: impl FnOnce(PrefetchContext<'_>, &Arc<Fork>, usize) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let total_bytes = extents.iter().fold(0u64, |sum, extent| sum.saturating_add(extent.length));
        let total_bytes = usize::try_from(total_bytes).map_err(|_| StoreError::BufferLength {
            expected_bytes: total_bytes,
            actual_bytes: usize::MAX as u64,
        })?;
        summarize(extents, fork, self.config.fork_bytes_max, total_bytes)?;
        let live = self.fork(fork)?;
        let _shared = live.lock_shared()?;
        if self.bulk_segments(&live, extents).is_some() {
            return Ok(None);
        }
        let context =
            PrefetchContext { engine: self.engine(), cache: &self.cache, budget: &self.prefetch_budget };
        start(context, &live, total_bytes).map(Some)
    }

    /// Writes `data` (packed in extent order) to the extents; later extents win on overlap.
    /// A write reserves the blocks it touches first (never the holes between its extents):
    /// `TargetFull`, with nothing applied, if there is no space.
    pub fn write(&self, fork: &ForkRef<'_>, extents: &[Extent], data: &[u8]) -> Result<(), StoreError> {
        summarize(extents, fork, self.config.fork_bytes_max, data.len())?;
        let live = self.fork(fork)?;
        let _shared = live.lock_shared()?;
        // `summarize` checked that no extent's end overflows.
        let ranges = extents.iter().map(|extent| (extent.offset, extent.offset + extent.length));
        if live.reserve(ranges, 1 << self.block_shift)? {
            bump(&self.counters.reservations, 1);
        }
        let Some(segments) = self.bulk_segments(&live, extents) else {
            request::write(self.engine(), &live, extents, data)?;
            if let Some(write_full) = &self.write_full {
                write_full.wrote(&self.cache, live.serial(), extents, 1 << self.block_shift);
            }
            bump(&self.counters.write_requests, 1);
            bump(&self.counters.write_bytes, data.len() as u64);
            return Ok(());
        };
        // In extent order, each segment whole before the next, so later extents still win.
        for segment in segments {
            match segment {
                Segment::Cache { extents, data: range } => {
                    request::write(self.engine(), &live, &extents, &data[range])?;
                    if let Some(write_full) = &self.write_full {
                        write_full.wrote(&self.cache, live.serial(), &extents, 1 << self.block_shift);
                    }
                }
                Segment::Bulk { extent, data: range } => {
                    bulk::write(self.engine(), &self.counters, &live, extent, &data[range])?
                }
            }
        }
        bump(&self.counters.write_requests, 1);
        bump(&self.counters.write_bytes, data.len() as u64);
        Ok(())
    }

    /// The request cut into cache and bulk segments, if it has a bulk piece and the fork's
    /// target takes bulk data past the cache: `dir` (and the tests' `crash`), whose fork
    /// files sit in the kernel's page cache. `sim` targets time every transfer on their disk
    /// thread and `lines` targets map blocks onto lines, so both keep the cache path.
    fn bulk_segments(&self, live: &Fork, extents: &[Extent]) -> Option<Vec<Segment>> {
        let direct = match live.target().kind() {
            TargetKind::Dir => true,
            #[cfg(feature = "test-support")]
            TargetKind::Crash => true,
            TargetKind::Sim(_) | TargetKind::Lines(_) => false,
        };
        if !direct {
            return None;
        }
        bulk::split(extents, self.block_shift, self.config.bulk_bytes_min)
    }

    /// Creates a subfile with an empty `data` fork; does nothing if it exists.
    pub fn create_subfile(
        &self,
        target: TargetId,
        file: FileId,
        subfile: SubfileIndex,
    ) -> Result<(), StoreError> {
        self.runtime(target)?.create_subfile(file, subfile)
    }

    /// Removes a subfile and all its forks, dropping their cached blocks.
    pub fn remove_subfile(
        &self,
        target: TargetId,
        file: FileId,
        subfile: SubfileIndex,
    ) -> Result<(), StoreError> {
        self.runtime(target)?.remove_subfile(&self.cache, file, subfile)
    }

    /// Creates an empty fork; `ForkExists` if there is one.
    pub fn create_fork(&self, fork: &ForkRef<'_>) -> Result<(), StoreError> {
        self.runtime(fork.target)?.create_fork(fork)
    }

    /// Removes a fork, dropping its cached blocks.
    pub fn remove_fork(&self, fork: &ForkRef<'_>) -> Result<(), StoreError> {
        self.runtime(fork.target)?.remove_fork(&self.cache, fork)
    }

    /// The forks of a subfile and their sizes, sorted by name.
    pub fn list_forks(
        &self,
        target: TargetId,
        file: FileId,
        subfile: SubfileIndex,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        self.runtime(target)?.list_forks(file, subfile)
    }

    /// The fork's size: the largest end written, extended or truncated to.
    pub fn fork_size(&self, fork: &ForkRef<'_>) -> Result<u64, StoreError> {
        let live = self.fork(fork)?;
        let _shared = live.lock_shared()?;
        Ok(live.size_bytes())
    }

    /// Preallocates the fork up to `size_bytes` (Galley's `gfs_extend`) and grows its size to
    /// at least that, so later writes below it cannot fail for lack of space.
    pub fn extend(&self, fork: &ForkRef<'_>, size_bytes: u64) -> Result<(), StoreError> {
        self.check_size(fork, size_bytes)?;
        let live = self.fork(fork)?;
        let _exclusive = live.lock_exclusive()?;
        live.allocate_and_grow(size_bytes)
    }

    /// Sets the fork's size; cached data past it is dropped, a grown part reads as zeros. A
    /// growth that is refused (no space, too large for the file system) changes nothing.
    pub fn truncate(&self, fork: &ForkRef<'_>, size_bytes: u64) -> Result<(), StoreError> {
        self.check_size(fork, size_bytes)?;
        let live = self.fork(fork)?;
        let _exclusive = live.lock_exclusive()?;
        if size_bytes > live.size_bytes() {
            // A grown part is a hole, as with ftruncate(2): nothing is allocated for it
            // (`extend` is the call that preallocates). Cached bytes past the old size are
            // zeros already; the size on disk changes first, so a refusal (a size the file
            // system cannot hold) leaves the size in memory as it was.
            live.truncate_on_disk(size_bytes)?;
            live.mark_unsynced();
            live.set_size(size_bytes);
            return Ok(());
        }
        live.set_size(size_bytes);
        if let Some(slot) = self.cache.truncate_blocks(live.serial(), size_bytes) {
            let tail_start = (size_bytes & ((1 << self.block_shift) - 1)) as usize;
            self.cache.pool().write(slot)[tail_start..].fill(0);
            self.cache.unpin_slot(slot);
        }
        live.truncate_on_disk(size_bytes)?;
        live.mark_unsynced();
        live.cut_reserved(size_bytes);
        Ok(())
    }

    fn check_size(&self, fork: &ForkRef<'_>, size_bytes: u64) -> Result<(), StoreError> {
        if size_bytes <= self.config.fork_bytes_max {
            return Ok(());
        }
        Err(StoreError::ForkTooLarge {
            file: fork.file,
            subfile: fork.subfile,
            fork: fork.fork.to_string(),
            target: fork.target,
            offset: 0,
            length: size_bytes,
            fork_bytes_max: self.config.fork_bytes_max,
        })
    }

    /// Writes the fork's dirty blocks back and fdatasyncs it (Galley's `gfs_sync`).
    pub fn sync(&self, fork: &ForkRef<'_>) -> Result<(), StoreError> {
        let live = self.fork(fork)?;
        let _shared = live.lock_shared()?;
        self.sync_locked(&live)
    }

    /// `sync` of a fork whose lock the caller holds (shared or exclusive).
    fn sync_locked(&self, live: &Arc<Fork>) -> Result<(), StoreError> {
        let items = self.cache.take_dirty(Some(live.serial()));
        write_back(&self.cache, items, Placement::Hot)?;
        live.wait_writebacks_idle();
        if live.sync_data()? {
            bump(&self.counters.disk_syncs, 1);
        }
        Ok(())
    }

    /// Makes several forks durable at once: writes back their dirty blocks in one batch (each
    /// target's scheduler sorts them), then fdatasyncs their data and checksum files on up to
    /// `sync_threads_max` threads at a time. Every fork is attempted; the first error is
    /// returned. A fork that does not exist is an error (`UnknownFork`/`UnknownSubfile`).
    pub fn sync_many(&self, forks: &[ForkRef<'_>]) -> Result<(), StoreError> {
        let mut live: Vec<Arc<Fork>> = forks.iter().map(|fork| self.fork(fork)).collect::<Result<_, _>>()?;
        // One lock per fork, always taken in serial order, so two calls cannot deadlock.
        live.sort_unstable_by_key(|fork| fork.serial());
        live.dedup_by_key(|fork| fork.serial());
        let _guards: Vec<_> = live.iter().map(|fork| fork.lock_shared()).collect::<Result<_, _>>()?;
        let mut items = Vec::new();
        for fork in &live {
            items.extend(self.cache.take_dirty(Some(fork.serial())));
        }
        write_back(&self.cache, items, Placement::Hot)?;
        let results = self.sync_forks(&live);
        results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }

    /// fdatasyncs the forks (after their write-backs finished), overlapping the calls.
    fn sync_forks(&self, forks: &[Arc<Fork>]) -> Vec<Result<(), StoreError>> {
        let threads = self.config.sync_threads_max.max(1);
        let mut results = Vec::with_capacity(forks.len());
        for group in forks.chunks(threads) {
            std::thread::scope(|scope| {
                let handles: Vec<_> =
                    group.iter().map(|fork| scope.spawn(move || self.sync_one(fork))).collect();
                for handle in handles {
                    let result = handle.join().unwrap_or_else(|_| {
                        Err(StoreError::io("fdatasync a fork", std::io::Error::other("sync thread panicked")))
                    });
                    results.push(result);
                }
            });
        }
        results
    }

    fn sync_one(&self, fork: &Arc<Fork>) -> Result<(), StoreError> {
        fork.wait_writebacks_idle();
        if fork.sync_data()? {
            bump(&self.counters.disk_syncs, 1);
        }
        Ok(())
    }

    /// `flotilla hsm` on one fork of a lines target with a tier: its state, or archive it
    /// (sync, copy whole, mark clean), release it (drop its blocks from disk; refused unless
    /// its archive copy holds every byte) or restore it (recall every block the disk lacks).
    /// Returns the fork's state afterwards.
    pub fn hsm(&self, fork: &ForkRef<'_>, action: HsmAction) -> Result<HsmState, StoreError> {
        fork.check_name()?;
        let target = self.runtime(fork.target)?.target().clone();
        let tier = target.tier().ok_or(StoreError::NoTier { target: fork.target })?.clone();
        let live = self.fork(fork)?;
        let key = Target::lines_key(fork.file, fork.subfile, fork.fork);
        let record_path = target.record_path(fork.file, fork.subfile, fork.fork);
        let failed = |what: &str, error: std::io::Error| {
            StoreError::io(format!("{what} fork {:?} of {}:{}", fork.fork, fork.file, fork.subfile), error)
        };
        match action {
            HsmAction::State => {}
            HsmAction::Archive => {
                self.sync(fork)?;
                let _shared = live.lock_shared()?;
                let backend = live.backend()?;
                let at_ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos();
                let object =
                    crate::tier::object_key(fork.target, fork.file.0, fork.subfile.0, fork.fork, at_ns);
                let read =
                    |offset: u64, buffer: &mut [u8]| backend.read_at(offset, &mut [buffer]).map(|_| ());
                tier.archive_fork(key, &record_path, object, live.size_bytes(), read)
                    .map_err(|error| failed("archive", error))?;
            }
            HsmAction::Release => {
                // Under the exclusive lock no write can land in the cache between the sync
                // and dropping the fork's cached blocks.
                let _exclusive = live.lock_exclusive()?;
                self.sync_locked(&live)?;
                tier.release(key, &record_path, live.size_bytes()).map_err(|reason| {
                    StoreError::HsmRefused {
                        action: "release",
                        file: fork.file,
                        subfile: fork.subfile,
                        fork: fork.fork.to_string(),
                        reason,
                    }
                })?;
                self.cache.drop_fork(live.serial());
            }
            HsmAction::Restore => {
                let _shared = live.lock_shared()?;
                tier.ensure_resident(key, &record_path, 0, live.size_bytes())
                    .map_err(|error| failed("restore", error))?;
            }
        }
        let _shared = live.lock_shared()?;
        tier.state(key, &record_path, live.size_bytes()).map_err(|error| failed("read the state of", error))
    }

    /// One pass of a lines target's migration manager (RAMA §4.2.3): archives every fork whose
    /// newest dirty block is older than the policy's age, then, when free space is below the
    /// low watermark, reclaims clean blocks (oldest first) up to the high one. `None` when
    /// the target has no tier or lost its contents.
    pub fn tier_pass(&self, target_id: TargetId) -> Result<Option<TierPass>, StoreError> {
        self.tier_pass_aged(target_id, None)
    }

    /// `tier_pass` archiving forks at least `age_s` old instead of the policy's age (0: every
    /// dirty fork — what a writer that found the target full of dirty blocks asks for).
    pub fn tier_pass_aged(
        &self,
        target_id: TargetId,
        age_s: Option<u64>,
    ) -> Result<Option<TierPass>, StoreError> {
        let target = self.any_runtime(target_id)?.target().clone();
        let Some(tier) = target.tier().cloned().filter(|_| target.lost().is_none()) else { return Ok(None) };
        let now = crate::lines_disk::now_s();
        let age_s = age_s.unwrap_or(tier.policy().archive_age_s);
        let mut pass = TierPass::default();
        for (key, newest_s) in tier.disk().dirty_forks() {
            if u64::from(now.saturating_sub(newest_s)) < age_s {
                continue;
            }
            let Some((file, subfile, name)) = target.fork_of_key(key)? else { continue };
            match self.hsm(&ForkRef::new(target_id, file, subfile, &name), HsmAction::Archive) {
                Ok(_) => pass.archived_forks += 1,
                Err(error) => {
                    pass.failures += 1;
                    tracing::warn!(target_id = %target_id, %error, "migration manager could not archive a fork");
                }
            }
        }
        let wanted = tier.reclaim_wanted();
        if wanted > 0 {
            pass.reclaimed_blocks = tier.disk().reclaim(wanted).map_err(|error| {
                StoreError::io(format!("reclaim clean blocks of target {target_id}"), error)
            })?;
        }
        Ok(Some(pass))
    }

    /// Reclaims up to `blocks` clean blocks of a target, oldest first (0 without a tier).
    pub fn reclaim(&self, target_id: TargetId, blocks: u64) -> Result<u64, StoreError> {
        let target = self.runtime(target_id)?.target().clone();
        let Some(tier) = target.tier() else { return Ok(0) };
        tier.disk()
            .reclaim(blocks)
            .map_err(|error| StoreError::io(format!("reclaim clean blocks of target {target_id}"), error))
    }

    /// The tier counters of a target (`None`: it has no tier).
    pub fn tier_stats(&self, target: TargetId) -> Result<Option<TierStats>, StoreError> {
        Ok(self.any_runtime(target)?.target().tier().map(|tier| tier.stats()))
    }

    /// Space used and free on a target's file system.
    pub fn usage(&self, target: TargetId) -> Result<TargetUsage, StoreError> {
        self.any_runtime(target)?.target().usage()
    }

    /// Writes back blocks dirty for at least `max_age`, and the oldest dirty blocks while more
    /// than `dirty_bytes_high_max` are dirty. Does not fdatasync. Returns the blocks written.
    /// The server calls this periodically.
    pub fn flush_aged(&self, max_age: Duration) -> Result<usize, StoreError> {
        let cutoff = Instant::now().checked_sub(max_age);
        let items = self.cache.take_dirty_aged(cutoff, self.config.dirty_bytes_high_max);
        write_back(&self.cache, items, Placement::Hot)
    }

    /// Writes back every dirty block and fdatasyncs (data and checksums of) every fork
    /// written since its last sync, overlapping the fdatasyncs; durable when it returns. A
    /// fork removed after the snapshot of live forks (`UnknownFork` from its sync) has
    /// nothing left to flush and is skipped; any other error is returned.
    pub fn flush_all(&self) -> Result<(), StoreError> {
        let items = self.cache.take_dirty(None);
        write_back(&self.cache, items, Placement::Hot)?;
        let live = self.live_forks();
        let first_error = self.sync_live(&live);
        for runtime in &self.targets {
            runtime.sync_closed()?;
        }
        first_error
    }

    /// Every live fork of every target, a snapshot.
    pub(crate) fn live_forks(&self) -> Vec<Arc<Fork>> {
        self.targets.iter().flat_map(TargetRuntime::live_forks).collect()
    }

    /// Syncs the forks of a `live_forks` snapshot; returns the first error, except
    /// `UnknownFork`: a fork removed since the snapshot has nothing left to flush.
    pub(crate) fn sync_live(&self, live: &[Arc<Fork>]) -> Result<(), StoreError> {
        let mut results = self.sync_forks(live).into_iter();
        results
            .find(|result| !matches!(result, Ok(()) | Err(StoreError::UnknownFork { .. })))
            .unwrap_or(Ok(()))
    }

    /// Looks a fork up and holds it (as a request in flight does).
    #[cfg(test)]
    pub(crate) fn hold_fork(&self, fork: &ForkRef<'_>) -> Result<Arc<Fork>, StoreError> {
        self.fork(fork)
    }

    /// The cache shard of a block of a fork.
    #[cfg(test)]
    pub(crate) fn cache_shard_of(&self, fork: &ForkRef<'_>, block: u64) -> usize {
        self.cache.shard_of(self.fork(fork).expect("a live fork").serial(), block)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> StoreStats {
        self.counters.snapshot(self.cache.dirty_bytes(), self.cache.cached_bytes())
    }

    /// Number of fork files currently open.
    pub fn open_fork_files(&self) -> usize {
        self.fds.open_count()
    }

    /// Bytes covered by one checksum entry on a target.
    pub fn checksum_block_bytes(&self, target: TargetId) -> Result<u64, StoreError> {
        Ok(self.any_runtime(target)?.target().checksum_block_bytes())
    }

    /// Holds a bulk gate over blocks `first..end` of a fork, as a bulk request would (which
    /// holds its fork meanwhile).
    #[cfg(test)]
    pub(crate) fn hold_bulk_gate(
        &self,
        fork: &ForkRef<'_>,
        first: u64,
        end: u64,
        write: bool,
    ) -> (Vec<crate::block_cache::BulkRun>, crate::block_cache::BulkGate<'_>, Arc<Fork>) {
        // The fork is returned too: a fork nobody holds is closed, and its serial retired.
        let live = self.fork(fork).expect("the fork exists");
        let (runs, gate) = self.cache.begin_bulk(live.serial(), first, end, write);
        (runs, gate, live)
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.cache.check_invariants();
    }

    #[cfg(test)]
    pub(crate) fn pinned_slots(&self) -> usize {
        self.cache.pinned_slots()
    }

    /// Shards of the cache and the most blocks a window pins.
    #[cfg(test)]
    pub(crate) fn cache_shape(&self) -> (usize, usize) {
        (self.cache.shard_count(), self.window_blocks_max)
    }
}

/// Disk threads of a target of `kind`: `disk_threads_per_target` for `dir` (and the tests'
/// `crash`), whose fork files take concurrent positioned I/O; one for `sim`, whose timing
/// model is one arm serving one transfer at a time on the disk thread, and for `lines`,
/// whose image I/O runs under the target's state lock (so more threads would only queue on
/// that lock) and whose read gathering assumes one sweep.
fn disk_threads(config: &StoreConfig, kind: &TargetKind) -> usize {
    match kind {
        TargetKind::Dir => config.disk_threads_per_target,
        #[cfg(feature = "test-support")]
        TargetKind::Crash => config.disk_threads_per_target,
        TargetKind::Sim(_) | TargetKind::Lines(_) => 1,
    }
}

/// The cache block must hold whole checksum blocks of every target.
fn check_checksum_block(config: &StoreConfig, target: &Target) -> Result<(), StoreError> {
    let checksum_block_bytes = target.checksum_block_bytes();
    if config.block_bytes.is_multiple_of(checksum_block_bytes) {
        return Ok(());
    }
    Err(StoreError::BadConfig {
        name: "block_bytes",
        reason: format!(
            "({}) must be a multiple of the checksum block ({checksum_block_bytes} bytes) of target {} at {:?}",
            config.block_bytes,
            target.id(),
            target.dir()
        ),
    })
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(error) = self.flush_all() {
            tracing::error!(%error, "flushing the store on drop failed; cached writes may be lost");
        }
        for runtime in &self.targets {
            runtime.disk().shutdown();
        }
        self.cache.clear();
    }
}
