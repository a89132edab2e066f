//! The tertiary tier of a `lines` target (RAMA §4.2.3, §4.3.3): archive copies of forks,
//! clean blocks, reclaim and transparent recall.
//!
//! The unit copied is a fork on this target (one server's share of a file: its subfile's
//! fork), whole, as one archive object; a fork's *archive record* (`tier_record`) names the
//! object. After a copy is durable and its record written, the fork's blocks are marked
//! *clean* in the line descriptors; reclaim drops clean blocks (oldest first) when space is
//! needed, and a read of a block that is below the record's `valid_bytes` but has no slot is
//! recalled: the extent around it is fetched in one archive request and written back as clean
//! blocks, and concurrent readers of the fork wait for the one recall in flight.
//!
//! A write after archiving makes its blocks dirty again (the record stays valid for the
//! blocks not rewritten, so reclaimed ones still recall correctly); the next archive writes a
//! new object and deletes the superseded one. A truncation below `valid_bytes` cuts it first.

use crate::lines_disk::{now_s, LinesDisk};
use crate::lines_format::ForkKey;
use crate::reserved::touched_runs;
use crate::tier_record::{self, dense_runs, ArchiveRecord, RUNS_MAX};
use flotilla_archive::Archive;
use flotilla_types::TargetId;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The migration manager's policy (chapter 3: migrate early, keep small files on disk,
/// read latency matters most).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierPolicy {
    /// A fork is archived once its newest dirty block is this old.
    pub archive_age_s: u64,
    /// Forks at most this large are kept on disk in preference to larger ones.
    pub keep_small_bytes: u64,
    /// How much older the clean blocks of a larger fork count for reclaim.
    pub large_age_bias_s: u32,
    /// Reclaim starts when free space falls below this percentage of the target ...
    pub free_low_percent: u8,
    /// ... and stops once it is back at this percentage.
    pub free_high_percent: u8,
    /// How often the migration manager scans the line descriptors.
    pub scan_interval_ms: u64,
    /// One recall fetches this much around the block read (a multiple of the block size).
    pub recall_extent_bytes: u64,
}

impl Default for TierPolicy {
    fn default() -> Self {
        TierPolicy {
            archive_age_s: 600,
            keep_small_bytes: 1 << 20,
            large_age_bias_s: 86_400,
            free_low_percent: 10,
            free_high_percent: 20,
            scan_interval_ms: 10_000,
            recall_extent_bytes: 64 << 20,
        }
    }
}

impl TierPolicy {
    /// Why the policy cannot work, if it cannot.
    pub fn check(&self, block_bytes: u64) -> Result<(), String> {
        if self.free_low_percent > self.free_high_percent || self.free_high_percent > 100 {
            return Err(format!(
                "free space watermarks {}% (low) and {}% (high) need low <= high <= 100",
                self.free_low_percent, self.free_high_percent
            ));
        }
        if self.recall_extent_bytes == 0 || !self.recall_extent_bytes.is_multiple_of(block_bytes) {
            return Err(format!(
                "recall extent {} bytes is not a positive multiple of the {block_bytes}-byte block",
                self.recall_extent_bytes
            ));
        }
        if self.scan_interval_ms == 0 {
            return Err("the migration manager's scan interval must be positive".into());
        }
        Ok(())
    }
}

/// An archive and the policy the store's lines targets use it with.
#[derive(Clone, Debug)]
pub struct TierConfig {
    pub archive: Arc<Archive>,
    pub policy: TierPolicy,
}

impl PartialEq for TierConfig {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.archive, &other.archive) && self.policy == other.policy
    }
}

impl Eq for TierConfig {}

/// What `flotilla hsm` asks of a fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HsmAction {
    State,
    Archive,
    Release,
    Restore,
}

/// Where a fork's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// On disk only: never archived (or not on a target with a tier).
    Resident,
    /// On disk, and the archive holds the same bytes.
    Archived,
    /// Some or all of its blocks are only in the archive (recalled on read).
    Released,
    /// Changed since its archive copy was made (the copy is superseded at the next archive).
    Modified,
}

/// A fork's place in the hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HsmState {
    pub residency: Residency,
    pub size_bytes: u64,
    /// Bytes of the fork's blocks on disk.
    pub resident_bytes: u64,
    /// Size of the archive copy (0: none).
    pub archived_bytes: u64,
    pub archived_at_s: u64,
    pub object_key: String,
}

/// Counters of one target's tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub archived_forks: u64,
    pub archived_bytes: u64,
    pub recalls: u64,
    pub recalled_bytes: u64,
    pub recall_failures: u64,
    pub released_forks: u64,
    pub superseded_copies: u64,
    /// Reads served from the archive without keeping the data (no space for a recall).
    pub read_throughs: u64,
    pub reclaimed_blocks: u64,
    pub dirty_blocks: u64,
    pub clean_blocks: u64,
    pub free_blocks: u64,
    pub block_bytes: u64,
}

#[derive(Default)]
struct Counters {
    archived_forks: AtomicU64,
    archived_bytes: AtomicU64,
    recalls: AtomicU64,
    recalled_bytes: AtomicU64,
    recall_failures: AtomicU64,
    released_forks: AtomicU64,
    superseded_copies: AtomicU64,
    read_throughs: AtomicU64,
}

/// One recall in flight: its outcome once done.
#[derive(Default)]
struct Recall {
    outcome: Mutex<Option<Result<(), String>>>,
    done: Condvar,
}

impl Recall {
    /// Waits for the leader's outcome (the guard is released before returning).
    fn wait(&self) -> io::Result<()> {
        let mut outcome = self.outcome.lock();
        while outcome.is_none() {
            self.done.wait(&mut outcome);
        }
        outcome.clone().expect("set").map_err(io::Error::other)
    }
}

/// Ends a leader's recall however it ends (a panic included): takes it out of the map first,
/// so a caller arriving later leads a new one instead of finding a finished one, then sets
/// the outcome and wakes the waiters. A leader that never got to set an outcome failed.
struct PublishOnDrop<'a> {
    tier: &'a TargetTier,
    key: ForkKey,
    recall: &'a Arc<Recall>,
    outcome: Option<Result<(), String>>,
}

impl Drop for PublishOnDrop<'_> {
    fn drop(&mut self) {
        self.tier.recalls.lock().remove(&self.key);
        let outcome = self
            .outcome
            .take()
            .unwrap_or_else(|| Err("the recall's leader stopped before it finished".into()));
        *self.recall.outcome.lock() = Some(outcome);
        self.recall.done.notify_all();
    }
}

/// The tier of one lines target.
pub(crate) struct TargetTier {
    config: TierConfig,
    target: TargetId,
    disk: Arc<LinesDisk>,
    records: Mutex<HashMap<ForkKey, Option<ArchiveRecord>>>,
    recalls: Mutex<HashMap<ForkKey, Arc<Recall>>>,
    counters: Counters,
}

impl std::fmt::Debug for TargetTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetTier").field("archive", &self.config.archive.url()).finish_non_exhaustive()
    }
}

/// Forks whose record (or absence of one) is kept in memory at once.
const RECORDS_CACHED_MAX: usize = 1 << 16;

/// Bytes of one ranged read of a recall (bounded memory per recall).
const RECALL_PIECE_BYTES: u64 = 8 << 20;

impl TargetTier {
    pub(crate) fn new(config: TierConfig, target: TargetId, disk: Arc<LinesDisk>) -> Self {
        TargetTier {
            config,
            target,
            disk,
            records: Mutex::new(HashMap::new()),
            recalls: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    pub(crate) fn policy(&self) -> &TierPolicy {
        &self.config.policy
    }

    pub(crate) fn disk(&self) -> &Arc<LinesDisk> {
        &self.disk
    }

    fn block_bytes(&self) -> u64 {
        u64::from(self.disk.geometry().block_bytes)
    }

    /// The fork's record (read from disk once, then kept).
    pub(crate) fn record(&self, key: ForkKey, record_path: &Path) -> io::Result<Option<ArchiveRecord>> {
        if let Some(known) = self.records.lock().get(&key) {
            return Ok(known.clone());
        }
        let record = tier_record::read(record_path)?;
        self.remember(key, record.clone());
        Ok(record)
    }

    /// Keeps a fork's record in memory; bounded: starts over rather than grow with every fork
    /// ever read.
    fn remember(&self, key: ForkKey, record: Option<ArchiveRecord>) {
        let mut records = self.records.lock();
        if records.len() >= RECORDS_CACHED_MAX && !records.contains_key(&key) {
            records.clear();
        }
        records.insert(key, record);
    }

    fn set_record(&self, key: ForkKey, record_path: &Path, record: Option<ArchiveRecord>) -> io::Result<()> {
        match &record {
            Some(record) => tier_record::write(record_path, record)?,
            None => tier_record::remove(record_path)?,
        }
        self.remember(key, record);
        Ok(())
    }

    /// Recalls whatever part of `offset_bytes..+length_bytes` the archive holds and the disk
    /// does not (the read path of a lines fork calls this before reading): each
    /// `recall_extent_bytes` window with a held block missing is recalled whole. Holes the
    /// archive does not hold are never recalled (they read as zeros, and stay holes).
    pub(crate) fn ensure_resident(
        &self,
        key: ForkKey,
        record_path: &Path,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> io::Result<()> {
        let Some(record) = self.record(key, record_path)? else { return Ok(()) };
        let extent = self.config.policy.recall_extent_bytes;
        let end = offset_bytes.saturating_add(length_bytes);
        for (fork_at, _, length) in record.held(offset_bytes, end) {
            let mut start = fork_at;
            while start < fork_at + length {
                let window = start / extent * extent;
                let stop = (window + extent).min(fork_at + length);
                if self.disk.any_missing(key, start, stop - start) {
                    self.recall_shared(key, &record, window..window.saturating_add(extent))?;
                }
                start = stop;
            }
        }
        Ok(())
    }

    /// Whether a block the archive holds in `range` has no written slot.
    fn held_missing(&self, key: ForkKey, record: &ArchiveRecord, range: &std::ops::Range<u64>) -> bool {
        record
            .held(range.start, range.end)
            .iter()
            .any(|(at, _, length)| self.disk.any_missing(key, *at, *length))
    }

    /// One recall of `range` per fork at a time: a second reader waits for the first's, then
    /// recalls what the first's range did not cover (a loop, never holding a lock across it).
    fn recall_shared(
        &self,
        key: ForkKey,
        record: &ArchiveRecord,
        range: std::ops::Range<u64>,
    ) -> io::Result<()> {
        loop {
            let (recall, leader) = self.join_or_lead(key);
            if leader {
                let mut publish = PublishOnDrop { tier: self, key, recall: &recall, outcome: None };
                // A leader that finished after this caller's check left nothing to recall.
                let result = match self.held_missing(key, record, &range) {
                    true => self.recall(key, record, range.clone()),
                    false => Ok(()),
                };
                publish.outcome = Some(result.as_ref().map(|_| ()).map_err(|error| error.to_string()));
                drop(publish);
                return result;
            }
            recall.wait()?;
            if !self.held_missing(key, record, &range) {
                return Ok(());
            }
        }
    }

    /// The recall in flight for `key` to wait for, or a new one this caller leads.
    fn join_or_lead(&self, key: ForkKey) -> (Arc<Recall>, bool) {
        let mut recalls = self.recalls.lock();
        match recalls.get(&key) {
            Some(recall) => (recall.clone(), false),
            None => {
                let recall = Arc::new(Recall::default());
                recalls.insert(key, recall.clone());
                (recall, true)
            }
        }
    }

    /// Fetches the held parts of `range` (its runs, never its holes) in pieces of at most
    /// `RECALL_PIECE_BYTES` and writes the blocks the disk lacks as clean blocks.
    fn recall(&self, key: ForkKey, record: &ArchiveRecord, range: std::ops::Range<u64>) -> io::Result<()> {
        tracing::info!(
            target_id = %self.target, object = %record.object_key, start = range.start, end = range.end,
            "recalling from the archive (the read waits)"
        );
        self.counters.recalls.fetch_add(1, Ordering::Relaxed);
        let block_bytes = self.block_bytes();
        for (fork_at, object_at, length) in record.held(range.start, range.end) {
            if !fork_at.is_multiple_of(block_bytes) {
                return Err(io::Error::other(format!(
                    "archive record of {} holds a run at {fork_at}, not at a block boundary",
                    record.object_key
                )));
            }
            let mut done = 0u64;
            while done < length {
                let piece = (length - done).min(RECALL_PIECE_BYTES);
                let object_from = object_at + done;
                let bytes = self.fetch_recalled(record, object_from..object_from + piece)?;
                self.disk.write_recalled(key, (fork_at + done) / block_bytes, &bytes, now_s())?;
                self.counters.recalled_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                done += piece;
            }
        }
        Ok(())
    }

    /// Object bytes `range` for a recall, all of them or an error naming the object.
    fn fetch_recalled(
        &self,
        record: &ArchiveRecord,
        range: std::ops::Range<u64>,
    ) -> io::Result<bytes::Bytes> {
        let bytes = self.config.archive.get_range(&record.object_key, range.clone()).map_err(|error| {
            self.counters.recall_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target_id = %self.target, %error, "recall failed");
            io::Error::other(format!("recall of {} from the archive failed: {error}", record.object_key))
        })?;
        if (bytes.len() as u64) < range.end - range.start {
            self.counters.recall_failures.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::other(format!(
                "archive object {} is shorter ({} bytes at {}) than its record says ({})",
                record.object_key,
                bytes.len(),
                range.start,
                record.object_bytes()
            )));
        }
        Ok(bytes)
    }

    /// Reads `range` of a fork's archive object (object offsets: `ArchiveRecord::held` maps
    /// fork bytes to them) without keeping it on disk (a read-through, when the target has
    /// no space for a recall). Counted as a recall.
    pub(crate) fn fetch(
        &self,
        record: &ArchiveRecord,
        range: std::ops::Range<u64>,
    ) -> io::Result<bytes::Bytes> {
        self.counters.read_throughs.fetch_add(1, Ordering::Relaxed);
        let bytes = self.config.archive.get_range(&record.object_key, range.clone()).map_err(|error| {
            self.counters.recall_failures.fetch_add(1, Ordering::Relaxed);
            io::Error::other(format!("read of {} from the archive failed: {error}", record.object_key))
        })?;
        if (bytes.len() as u64) < range.end - range.start {
            return Err(io::Error::other(format!(
                "archive object {} is shorter than its record says",
                record.object_key
            )));
        }
        self.counters.recalled_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    /// Copies a fork to the archive — the blocks it holds, not its holes: the blocks on disk
    /// and those only in the previous copy (read by `read`, which recalls blocks the disk
    /// lacks), as the record's runs — makes the new record durable, marks the blocks clean if
    /// nothing changed them meanwhile, and deletes the superseded copy.
    pub(crate) fn archive_fork(
        &self,
        key: ForkKey,
        record_path: &Path,
        object_key: String,
        size_bytes: u64,
        mut read: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let generation = self.disk.generation(key);
        let previous = self.record(key, record_path)?;
        let runs = self.runs_to_copy(key, previous.as_ref(), size_bytes);
        let object_bytes: u64 = runs.iter().map(|(_, length)| length).sum();
        let crc32c = self.config.archive.put(&object_key, object_bytes, |object_at, buffer| {
            read_runs(&runs, object_at, buffer, &mut read)
        })?;
        let record = ArchiveRecord {
            object_key,
            size_bytes,
            valid_bytes: size_bytes,
            archived_at_s: u64::from(now_s()),
            crc32c,
            runs,
        };
        self.set_record(key, record_path, Some(record))?;
        let bias = match size_bytes > self.config.policy.keep_small_bytes {
            true => self.config.policy.large_age_bias_s,
            false => 0,
        };
        let clean = self.disk.mark_clean(key, size_bytes.div_ceil(self.block_bytes()), generation, bias)?;
        if !clean {
            tracing::info!(target_id = %self.target, "fork changed while it was archived; it stays dirty");
        }
        self.counters.archived_forks.fetch_add(1, Ordering::Relaxed);
        self.counters.archived_bytes.fetch_add(object_bytes, Ordering::Relaxed);
        if let Some(previous) = previous {
            self.counters.superseded_copies.fetch_add(1, Ordering::Relaxed);
            self.delete_object(&previous.object_key);
        }
        Ok(())
    }

    /// The fork's byte ranges a new copy holds: every block written on disk and every block
    /// the previous copy still gives back, merged into runs and cut at `size_bytes`. More
    /// than `RUNS_MAX` runs: the whole fork as one run (holes copied as zeros).
    fn runs_to_copy(
        &self,
        key: ForkKey,
        previous: Option<&ArchiveRecord>,
        size_bytes: u64,
    ) -> Vec<(u64, u64)> {
        let block_bytes = self.block_bytes();
        let on_disk = self.disk.fork_blocks(key).into_iter().filter(|(_, written, _)| *written);
        let mut ranges: Vec<(u64, u64)> =
            on_disk.map(|(block, _, _)| (block * block_bytes, (block + 1) * block_bytes)).collect();
        if let Some(previous) = previous {
            let held = previous.held(0, size_bytes);
            ranges.extend(held.into_iter().map(|(at, _, length)| (at, at + length)));
        }
        let runs: Vec<(u64, u64)> = touched_runs(ranges.into_iter(), block_bytes)
            .into_iter()
            .map(|(start, end)| (start, end.min(size_bytes)))
            .filter(|(start, end)| start < end)
            .map(|(start, end)| (start, end - start))
            .collect();
        match runs.len() > RUNS_MAX {
            true => dense_runs(size_bytes),
            false => runs,
        }
    }

    fn delete_object(&self, object_key: &str) {
        if let Err(error) = self.config.archive.delete(object_key) {
            tracing::warn!(target_id = %self.target, %error, "could not delete a superseded archive copy");
        }
    }

    /// Where the fork's data is.
    pub(crate) fn state(&self, key: ForkKey, record_path: &Path, size_bytes: u64) -> io::Result<HsmState> {
        let record = self.record(key, record_path)?;
        let blocks = self.disk.fork_blocks(key);
        let block_bytes = self.block_bytes();
        let written: Vec<&(u64, bool, bool)> = blocks.iter().filter(|(_, written, _)| *written).collect();
        let resident_bytes =
            (written.len() as u64 * block_bytes).min(size_bytes.next_multiple_of(block_bytes));
        let Some(record) = record else {
            return Ok(HsmState {
                residency: Residency::Resident,
                size_bytes,
                resident_bytes,
                archived_bytes: 0,
                archived_at_s: 0,
                object_key: String::new(),
            });
        };
        let modified = record.size_bytes != size_bytes || written.iter().any(|(_, _, clean)| !clean);
        let held = |block: u64| record.holds(block * block_bytes, (block + 1) * block_bytes);
        let on_disk = written.iter().filter(|(block, _, _)| held(*block)).count() as u64;
        let residency = match (modified, on_disk < held_blocks(&record, block_bytes)) {
            (true, _) => Residency::Modified,
            (false, true) => Residency::Released,
            (false, false) => Residency::Archived,
        };
        Ok(HsmState {
            residency,
            size_bytes,
            resident_bytes,
            archived_bytes: record.size_bytes,
            archived_at_s: record.archived_at_s,
            object_key: record.object_key,
        })
    }

    /// Drops the fork's blocks from disk — only when its archive copy holds every byte.
    pub(crate) fn release(&self, key: ForkKey, record_path: &Path, size_bytes: u64) -> Result<u64, String> {
        let state = self.state(key, record_path, size_bytes).map_err(|error| error.to_string())?;
        match state.residency {
            Residency::Resident => {
                return Err("it has no archive copy (run `flotilla hsm archive` first)".into())
            }
            Residency::Modified => {
                return Err("it changed since its archive copy was made (archive it again first)".into())
            }
            Residency::Archived | Residency::Released => {}
        }
        let dropped = self.disk.release_fork(key).map_err(|error| error.to_string())?;
        self.counters.released_forks.fetch_add(1, Ordering::Relaxed);
        Ok(dropped)
    }

    /// A truncation to `size_bytes`: the archive copy past it is no longer the fork's data.
    pub(crate) fn truncated(&self, key: ForkKey, record_path: &Path, size_bytes: u64) -> io::Result<()> {
        let Some(mut record) = self.record(key, record_path)? else { return Ok(()) };
        if record.valid_bytes > size_bytes {
            record.valid_bytes = size_bytes;
            self.set_record(key, record_path, Some(record))?;
        }
        Ok(())
    }

    /// A removed fork: its record and its archive copy go too.
    pub(crate) fn forget(&self, key: ForkKey, record_path: &Path) -> io::Result<()> {
        let record = self.record(key, record_path)?;
        self.set_record(key, record_path, None)?;
        if let Some(record) = record {
            self.delete_object(&record.object_key);
        }
        self.records.lock().remove(&key);
        Ok(())
    }

    /// Counters and block counts.
    pub(crate) fn stats(&self) -> TierStats {
        let counts = self.disk.counts();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TierStats {
            archived_forks: load(&self.counters.archived_forks),
            archived_bytes: load(&self.counters.archived_bytes),
            recalls: load(&self.counters.recalls),
            recalled_bytes: load(&self.counters.recalled_bytes),
            recall_failures: load(&self.counters.recall_failures),
            released_forks: load(&self.counters.released_forks),
            superseded_copies: load(&self.counters.superseded_copies),
            read_throughs: load(&self.counters.read_throughs),
            reclaimed_blocks: self.disk.reclaimed_blocks(),
            dirty_blocks: counts.dirty,
            clean_blocks: counts.clean,
            free_blocks: counts.reusable,
            block_bytes: self.block_bytes(),
        }
    }

    /// Blocks to reclaim so that free space is back at the high watermark (0 unless it is
    /// below the low one).
    pub(crate) fn reclaim_wanted(&self) -> u64 {
        let total = self.disk.geometry().slots();
        reclaim_wanted(total, self.disk.counts().reusable, &self.config.policy)
    }
}

/// Blocks to reclaim: none while free slots are at or above the low watermark, else enough to
/// reach the high one.
pub fn reclaim_wanted(total_blocks: u64, free_blocks: u64, policy: &TierPolicy) -> u64 {
    let percent = |value: u8| total_blocks * u64::from(value) / 100;
    if free_blocks >= percent(policy.free_low_percent) {
        return 0;
    }
    percent(policy.free_high_percent).saturating_sub(free_blocks)
}

/// The archive object key of a fork's copy made at `at_ns`.
/// Blocks the copy holds and may still give back (runs start at block boundaries).
fn held_blocks(record: &ArchiveRecord, block_bytes: u64) -> u64 {
    let held = record.held(0, record.valid_bytes);
    held.iter().map(|(at, _, length)| (at + length).div_ceil(block_bytes) - at / block_bytes).sum()
}

/// Fills `buffer` with the object's bytes from `object_at` on: the runs' bytes one after
/// another, each read from the fork with `read`.
fn read_runs(
    runs: &[(u64, u64)],
    object_at: u64,
    buffer: &mut [u8],
    read: &mut impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    let (mut run_object_start, mut done) = (0u64, 0usize);
    for (fork_at, length) in runs {
        let run_object_end = run_object_start + length;
        let at = object_at + done as u64;
        if done < buffer.len() && at < run_object_end {
            let within = at - run_object_start;
            let count = ((length - within) as usize).min(buffer.len() - done);
            read(fork_at + within, &mut buffer[done..done + count])?;
            done += count;
        }
        run_object_start = run_object_end;
    }
    match done == buffer.len() {
        true => Ok(()),
        false => Err(io::Error::other(format!("object bytes {object_at}.. lie past the fork's runs"))),
    }
}

pub(crate) fn object_key(target: TargetId, file: u64, subfile: u32, fork: &str, at_ns: u128) -> String {
    format!("{:016x}/{file:016x}.{subfile}/{fork}/{at_ns}", target.0)
}

/// The record path of a fork (mirrors the fork's path under the target's `hsm` directory).
pub(crate) fn record_path(hsm_dir: &Path, relative: &Path) -> PathBuf {
    hsm_dir.join(relative)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_starts_below_the_low_watermark_and_refills_to_the_high_one() {
        let policy = TierPolicy { free_low_percent: 10, free_high_percent: 30, ..TierPolicy::default() };
        assert_eq!(reclaim_wanted(1000, 100, &policy), 0);
        assert_eq!(reclaim_wanted(1000, 99, &policy), 201);
        assert_eq!(reclaim_wanted(1000, 0, &policy), 300);
        let bad = TierPolicy { free_low_percent: 40, free_high_percent: 30, ..TierPolicy::default() };
        assert!(bad.check(4096).unwrap_err().contains("watermarks"));
        let odd = TierPolicy { recall_extent_bytes: 5000, ..TierPolicy::default() };
        assert!(odd.check(4096).unwrap_err().contains("recall extent"));
    }
}
