//! A fork that the store has in use: its identity, logical size, reserved space, lock and
//! (through the fd cache) its open block I/O.
//!
//! Invariants:
//! - `serial` is unique in the process and never reused, so cache keys of a removed fork can
//!   never be mistaken for those of a fork created later under the same name.
//! - `size_bytes` is the fork's logical size: the largest end ever written, extended or
//!   truncated to. Cached bytes past it are always zero. A write request raises it after
//!   copying its data and before marking its blocks dirty, so a write-back never cuts
//!   written data off.
//! - Every byte in `reserved` has space allocated on the target, so writing it back cannot
//!   fail for lack of space. A write reserves the blocks it touches, never the span between
//!   its pieces, so holes stay holes (`reserved.rs`).
//! - Requests hold `lock` shared for their whole duration; truncate and remove hold it
//!   exclusive, so they never run while a request of this fork is in flight. Removal sets
//!   `removed` under the exclusive lock; a request checks it after taking the lock.
//! - `writebacks` counts write-back operations queued or running for this fork, so `sync`
//!   can wait for write-backs that others started before it fdatasyncs.

use crate::backend::ForkBackend;
use crate::checksum::{self, CHECKSUM_ENTRY_BYTES};
use crate::disk_manager::DiskManager;
use crate::error::{is_no_space, Mismatch, StoreError};
use crate::fd_cache::FdCache;
use crate::fork_ref::ForkRef;
use crate::reserved::{touched_runs, Reserved, RESERVED_RANGES_MAX};
use crate::target::Target;
use flotilla_types::{FileId, SubfileIndex};
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::HashSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Checksum file space is reserved in steps of this many bytes (1024 entries).
const CHECKSUM_RESERVE_GRANULE_BYTES: u64 = 4096;

static NEXT_FORK_SERIAL: AtomicU64 = AtomicU64::new(1);

/// What every fork of one target shares.
#[derive(Clone, Debug)]
pub(crate) struct ForkContext {
    pub target: Arc<Target>,
    pub disk: Arc<DiskManager>,
    pub fds: Arc<FdCache>,
    /// Files of forks that went out of use with written data not yet fdatasynced; a fork
    /// opened again takes its path back (and starts unsynced), so its `sync` covers them.
    pub unsynced_closed: Arc<Mutex<HashSet<PathBuf>>>,
}

/// A fork in use by the store.
pub(crate) struct Fork {
    serial: u64,
    file: FileId,
    subfile: SubfileIndex,
    name: String,
    path: PathBuf,
    location: u64,
    context: ForkContext,
    size_bytes: AtomicU64,
    /// Byte ranges of the fork known to have space allocated.
    reserved: Mutex<Reserved>,
    /// Byte ranges of the checksum file known to have space allocated.
    checksums_reserved: Mutex<Reserved>,
    lock: RwLock<()>,
    removed: AtomicBool,
    backend: Mutex<Option<Arc<dyn ForkBackend>>>,
    writebacks: Mutex<u64>,
    writebacks_idle: Condvar,
    unsynced: AtomicBool,
}

impl fmt::Debug for Fork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fork({self}, serial {})", self.serial)
    }
}

impl fmt::Display for Fork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fork {} of {}:{} on target {}",
            self.name,
            self.file,
            self.subfile,
            self.context.target.id()
        )
    }
}

impl Fork {
    /// Wraps a freshly opened fork; its size on disk becomes its logical size.
    pub(crate) fn open(
        context: &ForkContext,
        fork: &ForkRef<'_>,
        backend: Arc<dyn ForkBackend>,
    ) -> Result<Arc<Fork>, StoreError> {
        let size_bytes =
            backend.size_bytes().map_err(|error| StoreError::io(format!("stat {fork}"), error))?;
        let path = context.target.fork_path(fork.file, fork.subfile, fork.fork);
        let unsynced = context.unsynced_closed.lock().remove(&path);
        let opened = Arc::new(Fork {
            serial: NEXT_FORK_SERIAL.fetch_add(1, Ordering::Relaxed),
            file: fork.file,
            subfile: fork.subfile,
            name: fork.fork.to_string(),
            path,
            location: backend.location(),
            context: context.clone(),
            size_bytes: AtomicU64::new(size_bytes),
            reserved: Mutex::new(reserved_at_open(backend.as_ref(), size_bytes)),
            checksums_reserved: Mutex::new(Reserved::new(RESERVED_RANGES_MAX)),
            lock: RwLock::new(()),
            removed: AtomicBool::new(false),
            backend: Mutex::new(None),
            writebacks: Mutex::new(0),
            writebacks_idle: Condvar::new(),
            unsynced: AtomicBool::new(unsynced),
        });
        context.fds.install(&opened, backend);
        Ok(opened)
    }

    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn location(&self) -> u64 {
        self.location
    }

    pub(crate) fn target(&self) -> &Arc<Target> {
        &self.context.target
    }

    pub(crate) fn disk(&self) -> &Arc<DiskManager> {
        &self.context.disk
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Raises the logical size to at least `end_bytes`.
    pub(crate) fn grow_size(&self, end_bytes: u64) {
        self.size_bytes.fetch_max(end_bytes, Ordering::AcqRel);
    }

    /// Sets the logical size (truncate; caller holds the exclusive lock).
    pub(crate) fn set_size(&self, size_bytes: u64) {
        self.size_bytes.store(size_bytes, Ordering::Release);
    }

    /// Describes checksum block at `offset_bytes` failing its checksum.
    pub(crate) fn mismatch(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        stored: u32,
        computed: u32,
    ) -> Mismatch {
        Mismatch {
            target: self.context.target.id(),
            file: self.file,
            subfile: self.subfile,
            fork: self.name.clone(),
            offset: offset_bytes,
            length: length_bytes,
            stored,
            computed,
        }
    }

    pub(crate) fn unknown(&self) -> StoreError {
        StoreError::UnknownFork {
            file: self.file,
            subfile: self.subfile,
            fork: self.name.clone(),
            target: self.context.target.id(),
        }
    }

    /// Takes the lock shared, for a request; `UnknownFork` if the fork was removed.
    pub(crate) fn lock_shared(&self) -> Result<RwLockReadGuard<'_, ()>, StoreError> {
        let guard = self.lock.read();
        if self.removed.load(Ordering::Acquire) {
            return Err(self.unknown());
        }
        Ok(guard)
    }

    /// Takes the lock exclusive, for truncate or remove; `UnknownFork` if already removed.
    pub(crate) fn lock_exclusive(&self) -> Result<RwLockWriteGuard<'_, ()>, StoreError> {
        let guard = self.lock.write();
        if self.removed.load(Ordering::Acquire) {
            return Err(self.unknown());
        }
        Ok(guard)
    }

    /// Marks the fork removed (caller holds the exclusive lock) and closes its file.
    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
        self.context.fds.forget(self);
    }

    /// The fork's block I/O, reopening its file if the fd cache closed it.
    pub(crate) fn backend(self: &Arc<Self>) -> Result<Arc<dyn ForkBackend>, StoreError> {
        self.context.fds.backend(self)
    }

    pub(crate) fn cached_backend(&self) -> Option<Arc<dyn ForkBackend>> {
        self.backend.lock().clone()
    }

    pub(crate) fn set_backend(&self, backend: Option<Arc<dyn ForkBackend>>) {
        *self.backend.lock() = backend;
    }

    /// Reserves space for a write of `ranges` (fork byte ranges) before it is acknowledged:
    /// the `granule_bytes` blocks they touch that are not known to be allocated, each run of
    /// touching blocks in one call, and their checksum entries. Never the span between
    /// ranges: a write far past the end, or two pieces far apart in one request, reserves
    /// only its own blocks. When a run's rounded blocks do not fit, the exact bytes are tried.
    /// Returns whether a reservation was made; `TargetFull` if no space.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        ranges: impl Iterator<Item = (u64, u64)>,
        granule_bytes: u64,
    ) -> Result<bool, StoreError> {
        let mut reserved = self.reserved.lock();
        let exact: Vec<(u64, u64)> = ranges.filter(|(start, end)| start < end).collect();
        let runs = touched_runs(exact.iter().copied(), granule_bytes);
        let gaps: Vec<(u64, u64)> =
            runs.iter().flat_map(|(start, end)| reserved.missing(*start, *end)).collect();
        if gaps.is_empty() {
            return Ok(false);
        }
        let backend = self.backend()?;
        for (start, end) in gaps {
            match backend.allocate(start, end - start, false) {
                Ok(()) => reserved.insert(start, end),
                Err(error) if is_no_space(&error) => {
                    self.reserve_exact(backend.as_ref(), &mut reserved, &exact, (start, end))?
                }
                Err(error) => return Err(self.space_error("reserve space for", error)),
            }
        }
        drop(reserved);
        self.reserve_checksums(backend.as_ref(), &runs)?;
        Ok(true)
    }

    /// A rounded gap did not fit: reserves only the bytes of `exact` inside it.
    fn reserve_exact(
        &self,
        backend: &dyn ForkBackend,
        reserved: &mut Reserved,
        exact: &[(u64, u64)],
        (gap_start, gap_end): (u64, u64),
    ) -> Result<(), StoreError> {
        for (start, end) in touched_runs(exact.iter().copied(), 1) {
            let (start, end) = (start.max(gap_start), end.min(gap_end));
            for (from, to) in reserved.missing(start, end) {
                backend
                    .allocate(from, to - from, false)
                    .map_err(|error| self.space_error("reserve space for", error))?;
                reserved.insert(from, to);
            }
        }
        Ok(())
    }

    /// Reserves the checksum entries of the fork byte `runs`, each rounded out to
    /// `CHECKSUM_RESERVE_GRANULE_BYTES` of the checksum file (one reservation covers many
    /// appends); entries of holes between runs stay unallocated (an entry never written
    /// reads as 0, "never written").
    fn reserve_checksums(&self, backend: &dyn ForkBackend, runs: &[(u64, u64)]) -> Result<(), StoreError> {
        let checksum_bytes = self.context.target.checksum_block_bytes();
        let entry_runs = runs.iter().map(|(start, end)| {
            (
                start / checksum_bytes * CHECKSUM_ENTRY_BYTES,
                end.div_ceil(checksum_bytes) * CHECKSUM_ENTRY_BYTES,
            )
        });
        let entry_runs = touched_runs(entry_runs, CHECKSUM_RESERVE_GRANULE_BYTES);
        let mut reserved = self.checksums_reserved.lock();
        for (start, end) in entry_runs {
            for (from, to) in reserved.missing(start, end) {
                backend
                    .allocate_checksums(from, to - from)
                    .map_err(|error| self.space_error("reserve checksum space for", error))?;
                reserved.insert(from, to);
            }
        }
        Ok(())
    }

    /// Allocates `0..size_bytes` and grows the fork to at least that size (extend: Galley's
    /// explicit preallocation, the one call that reserves bytes nobody wrote). The space is
    /// allocated first, keeping the size on disk, and the sizes (on disk, then in memory)
    /// change only once it is: a refusal (no space, a size the file system cannot hold)
    /// leaves the fork's size as it was.
    pub(crate) fn allocate_and_grow(self: &Arc<Self>, size_bytes: u64) -> Result<(), StoreError> {
        let mut reserved = self.reserved.lock();
        let backend = self.backend()?;
        // More than the free space cannot succeed: refused before any block is allocated.
        let free_bytes = self.context.target.usage()?.free_bytes;
        let missing_bytes: u64 = reserved.missing(0, size_bytes).iter().map(|(from, to)| to - from).sum();
        if missing_bytes > free_bytes {
            return Err(self.context.target.full());
        }
        backend.allocate(0, size_bytes, false).map_err(|error| self.space_error("extend", error))?;
        reserved.insert(0, size_bytes);
        drop(reserved);
        self.reserve_checksums(backend.as_ref(), &[(0, size_bytes)])?;
        let disk_size_bytes = backend.size_bytes().map_err(|error| self.space_error("stat", error))?;
        if size_bytes > disk_size_bytes {
            backend.set_size(size_bytes).map_err(|error| self.space_error("extend", error))?;
        }
        self.grow_size(size_bytes);
        Ok(())
    }

    /// Sets the size on disk (truncate) and keeps the checksum entries right: a checksum block
    /// the new end cuts gets its entry recomputed over what remains (only if it passed its
    /// old checksum, so a corrupt block stays an error), and entries past the end are dropped.
    pub(crate) fn truncate_on_disk(self: &Arc<Self>, size_bytes: u64) -> Result<(), StoreError> {
        let backend = self.backend()?;
        let fail = |what: &str, error| {
            StoreError::io(format!("{what} {self} (truncate to {size_bytes} bytes)"), error)
        };
        let checksum_bytes = self.context.target.checksum_block_bytes();
        let tail = (size_bytes % checksum_bytes) as usize;
        let cut_block = size_bytes / checksum_bytes;
        let disk_size = backend.size_bytes().map_err(|error| fail("stat", error))?;
        let mut block = Vec::new();
        if tail != 0 && size_bytes < disk_size {
            block.resize(checksum_bytes as usize, 0);
            backend
                .read_at(cut_block * checksum_bytes, &mut [&mut block])
                .map_err(|error| fail("read", error))?;
            let mut stored = [0u32];
            backend
                .read_checksums(cut_block, &mut stored)
                .map_err(|error| fail("read checksum of", error))?;
            if checksum::block_matches(&block, stored[0]).is_err() {
                block.clear();
            }
        }
        backend.set_size(size_bytes).map_err(|error| fail("truncate", error))?;
        if !block.is_empty() {
            let entry = checksum::block_crc(&block[..tail], checksum_bytes as usize);
            backend.write_checksums(cut_block, &[entry]).map_err(|error| fail("write checksum of", error))?;
        }
        let blocks = size_bytes.div_ceil(checksum_bytes);
        backend.truncate_checksums(blocks).map_err(|error| fail("truncate checksums of", error))
    }

    /// After a truncate to `size_bytes`: nothing at or past it counts as reserved.
    pub(crate) fn cut_reserved(&self, size_bytes: u64) {
        self.reserved.lock().cut(size_bytes);
        let checksum_bytes = self.context.target.checksum_block_bytes();
        let entries_end = size_bytes.div_ceil(checksum_bytes) * CHECKSUM_ENTRY_BYTES;
        self.checksums_reserved.lock().cut(entries_end);
    }

    fn space_error(&self, action: &str, error: io::Error) -> StoreError {
        if is_no_space(&error) {
            return self.context.target.full();
        }
        StoreError::io(format!("{action} {self}"), error)
    }

    pub(crate) fn writeback_started(&self) {
        *self.writebacks.lock() += 1;
    }

    pub(crate) fn writeback_finished(&self) {
        let mut count = self.writebacks.lock();
        assert!(*count > 0, "write-back finished more often than started");
        *count -= 1;
        if *count == 0 {
            self.writebacks_idle.notify_all();
        }
    }

    /// Notes that data was written to the file and is not yet durable.
    pub(crate) fn mark_unsynced(&self) {
        self.unsynced.store(true, Ordering::Release);
    }

    /// Makes data written so far durable (fdatasync), if any was written since the last time.
    /// Returns whether it synced.
    /// An earlier `Fork` of the same file that went out of use unsynced counts too (its drop
    /// may race with this fork's open).
    pub(crate) fn sync_data(self: &Arc<Self>) -> Result<bool, StoreError> {
        let closed_unsynced = self.context.unsynced_closed.lock().remove(&self.path);
        if !self.unsynced.swap(false, Ordering::AcqRel) && !closed_unsynced {
            return Ok(false);
        }
        let result = self.backend().and_then(|backend| {
            backend.sync_data().map_err(|error| StoreError::io(format!("fdatasync {self}"), error))
        });
        if result.is_err() {
            self.unsynced.store(true, Ordering::Release);
        }
        result.map(|()| true)
    }

    /// Blocks until no write-back of this fork is queued or running.
    pub(crate) fn wait_writebacks_idle(&self) {
        let mut count = self.writebacks.lock();
        while *count > 0 {
            self.writebacks_idle.wait(&mut count);
        }
    }
}

impl Drop for Fork {
    fn drop(&mut self) {
        self.context.fds.forget(self);
        if self.unsynced.load(Ordering::Acquire) && !self.removed.load(Ordering::Acquire) {
            self.context.unsynced_closed.lock().insert(self.path.clone());
        }
    }
}

/// What an opened fork counts as reserved: all of it when its file is as large on disk as
/// its size (written densely or extended), else nothing (a sparse fork: its holes are
/// reserved when written; reserving again what is allocated changes nothing).
fn reserved_at_open(backend: &dyn ForkBackend, size_bytes: u64) -> Reserved {
    let mut reserved = Reserved::new(RESERVED_RANGES_MAX);
    if backend.allocated_bytes().ok().flatten().is_some_and(|allocated| allocated >= size_bytes) {
        reserved.insert(0, size_bytes);
    }
    reserved
}
