//! One target's disk scheduler: a bounded pool of disk threads (`threads`, from
//! `disk_threads_per_target`) serving one bounded queue of block reads and write-backs in
//! C-SCAN order (see `disk_queue`), moving adjacent blocks of one fork in one vectored system
//! call. Each thread takes the next run of the sweep, so with several threads a target has
//! that many transfers in flight (queue depth > 1) and the device can overlap them.
//!
//! Protocol with the cache:
//! - A read fills a `LOADING` slot and marks it ready or failed; requests wait on the slot.
//!   A read may carry a `Completion` ticket (a prefetch), reported after the slot is marked
//!   and with no lock of the scheduler held (the ticket's callback may touch the cache).
//! - A write-back carries a `Completion` ticket and copies the slot's bytes, up to the fork's
//!   logical size, to disk; the slot stays pinned by the flusher until the ticket completes.
//! - For one block key, every queued operation names the same slot (the cache never maps a
//!   key to two slots, and never reassigns a pinned slot), so duplicates are served by one
//!   transfer.
//! - A block key is moved by at most one thread at a time (the queue keeps taken keys in
//!   flight until `finish`), so a write-back of block B queued while B is being read or
//!   written back waits for that transfer: data and checksum entries of B are never written
//!   by two threads at once, and a later write-back of B always lands after an earlier one.
//!   Distinct keys have distinct slots and distinct checksum entries, so their transfers may
//!   overlap.
//!
//! Invariants: the queue holds at most `queue_ops_max` operations (submitters block);
//! after `shutdown` no operation is accepted, the queue is drained, and every thread exits.

use crate::backend::ForkBackend;
use crate::checksum;
use crate::completion::Completion;
use crate::disk_queue::{DiskQueue, QueueKey, QueuedOp, Run, RunSpan};
use crate::error::StoreError;
use crate::fork::Fork;
use crate::slot_pool::{SlotFailure, SlotPool};
use crate::stats::{bump, Counters};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// What a queued operation does.
#[derive(Debug)]
pub(crate) enum DiskOpKind {
    /// Load the block into its slot; report to the ticket, if any, once the slot is ready or
    /// failed (a prefetch waiting without a thread, `request::prefetch`).
    Read(Option<Arc<Completion>>),
    /// Write the slot's bytes back; report to the ticket.
    Write(Arc<Completion>),
}

/// One block operation.
#[derive(Debug)]
pub(crate) struct DiskOp {
    pub fork: Arc<Fork>,
    pub block: u64,
    pub slot: u32,
    pub kind: DiskOpKind,
}

impl QueuedOp for DiskOp {
    fn is_write(&self) -> bool {
        matches!(self.kind, DiskOpKind::Write(_))
    }
}

impl DiskOp {
    fn key(&self) -> QueueKey {
        QueueKey { location: self.fork.location(), fork_serial: self.fork.serial(), block: self.block }
    }
}

/// Sizes of a scheduler.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DiskLimits {
    pub queue_ops_max: usize,
    pub run_blocks_max: usize,
    /// Serve a fork's later read runs with the first in one backend call (lines targets).
    pub gather_reads: bool,
    /// Disk threads serving the queue (transfers in flight at once).
    pub threads: usize,
}

#[derive(Debug)]
struct DiskState {
    queue: DiskQueue<DiskOp>,
    shutdown: bool,
    /// Transfers (a run, or gathered runs) being done by the threads now.
    in_flight_runs: usize,
}

#[derive(Debug)]
struct DiskShared {
    state: Mutex<DiskState>,
    work: Condvar,
    space: Condvar,
    pool: Arc<SlotPool>,
    counters: Arc<Counters>,
    limits: DiskLimits,
}

/// The scheduler of one target.
#[derive(Debug)]
pub(crate) struct DiskManager {
    shared: Arc<DiskShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl DiskManager {
    /// Starts the scheduler's `limits.threads` threads, named `name` and a thread number.
    pub(crate) fn start(
        name: String,
        pool: Arc<SlotPool>,
        counters: Arc<Counters>,
        limits: DiskLimits,
    ) -> Result<Arc<DiskManager>, StoreError> {
        assert!(limits.queue_ops_max > 0 && limits.run_blocks_max > 0 && limits.threads > 0);
        let shared = Arc::new(DiskShared {
            state: Mutex::new(DiskState { queue: DiskQueue::new(), shutdown: false, in_flight_runs: 0 }),
            work: Condvar::new(),
            space: Condvar::new(),
            pool,
            counters,
            limits,
        });
        let manager =
            Arc::new(DiskManager { shared, threads: Mutex::new(Vec::with_capacity(limits.threads)) });
        for number in 0..limits.threads {
            let runner = manager.shared.clone();
            let thread_name = format!("{name}-{number}");
            let spawned = thread::Builder::new().name(thread_name.clone()).spawn(move || serve(&runner));
            match spawned {
                Ok(handle) => manager.threads.lock().push(handle),
                Err(error) => {
                    manager.shutdown();
                    return Err(StoreError::io(format!("start disk thread {thread_name}"), error));
                }
            }
        }
        Ok(manager)
    }

    /// Queues all `ops`, blocking while the queue is full. After shutdown, returns the
    /// operations it did not queue.
    pub(crate) fn submit(&self, ops: Vec<DiskOp>) -> Result<(), Vec<DiskOp>> {
        let mut pending: VecDeque<DiskOp> = ops.into();
        let mut state = self.shared.state.lock();
        while let Some(op) = pending.pop_front() {
            while state.queue.len() >= self.shared.limits.queue_ops_max && !state.shutdown {
                self.shared.work.notify_one();
                self.shared.space.wait(&mut state);
            }
            if state.shutdown {
                pending.push_front(op);
                return Err(pending.into());
            }
            state.queue.push(op.key(), op);
        }
        drop(state);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Stops accepting work, lets the threads drain the queue, and joins them (all but the
    /// calling thread, should a disk thread drop the last reference).
    pub(crate) fn shutdown(&self) {
        self.shared.state.lock().shutdown = true;
        self.shared.work.notify_all();
        self.shared.space.notify_all();
        let handles = std::mem::take(&mut *self.threads.lock());
        for handle in handles {
            if handle.thread().id() == thread::current().id() {
                continue;
            }
            if handle.join().is_err() {
                tracing::error!("a disk scheduler thread panicked");
            }
        }
    }
}

impl Drop for DiskManager {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve(shared: &DiskShared) {
    while let Some(mut runs) = next_runs(shared) {
        shared.space.notify_all();
        let spans: Vec<RunSpan> = runs.iter().map(Run::span).collect();
        if runs[0].is_write {
            write_run(shared, runs.pop().expect("one write run"));
        } else {
            read_runs(shared, runs);
        }
        finish(shared, &spans);
    }
}

/// Waits for the next run (or, when gathering, runs) whose blocks no other thread is
/// moving; `None` once shut down, drained and no transfer is left in flight.
fn next_runs(shared: &DiskShared) -> Option<Vec<Run<DiskOp>>> {
    let mut state = shared.state.lock();
    loop {
        let runs = match shared.limits.gather_reads {
            true => state.queue.pop_gathered(shared.limits.run_blocks_max),
            false => state.queue.pop_run(shared.limits.run_blocks_max).into_iter().collect(),
        };
        if !runs.is_empty() {
            if state.in_flight_runs > 0 {
                bump(&shared.counters.disk_runs_overlapped, 1);
            }
            state.in_flight_runs += 1;
            if state.queue.len() > 0 {
                // More work: wake another thread to take it (submitters wake only one).
                shared.work.notify_one();
            }
            return Some(runs);
        }
        if state.shutdown && state.queue.len() == 0 {
            return None;
        }
        shared.work.wait(&mut state);
    }
}

/// Releases the blocks of a finished transfer; threads waiting for one of them may go on.
fn finish(shared: &DiskShared, spans: &[RunSpan]) {
    let mut state = shared.state.lock();
    for span in spans {
        state.queue.finish(*span);
    }
    state.in_flight_runs -= 1;
    drop(state);
    if shared.limits.threads > 1 {
        shared.work.notify_all();
    }
}

fn block_offset(shared: &DiskShared, block: u64) -> u64 {
    block * shared.pool.block_bytes() as u64
}

/// Read runs of one fork (one, or several gathered) in one backend call; each block is then
/// checked against its checksum and its slot marked ready or failed.
fn read_runs(shared: &DiskShared, runs: Vec<Run<DiskOp>>) {
    let fork = runs[0].blocks[0][0].fork.clone();
    let result = load_runs(shared, &fork, &runs);
    for (index, run) in runs.iter().enumerate() {
        for (block, ops) in run.blocks.iter().enumerate() {
            debug_assert!(ops.iter().all(|op| op.slot == ops[0].slot));
            let failure = match &result {
                Ok(verdicts) => verdicts[index][block].as_ref(),
                Err(failure) => Some(failure),
            };
            match failure {
                None => shared.pool.mark_ready(ops[0].slot),
                Some(failure) => shared.pool.mark_failed(ops[0].slot, failure.clone()),
            }
            report_reads(ops, failure);
        }
    }
}

/// Reports a loaded (or failed) block to the tickets of the reads that asked for it.
fn report_reads(ops: &[DiskOp], failure: Option<&SlotFailure>) {
    for op in ops {
        if let DiskOpKind::Read(Some(ticket)) = &op.kind {
            ticket.complete(failure.map_or(Ok(()), |failure| Err(failure.to_error())));
        }
    }
}

/// Reads the runs' blocks into their slots and checks them against their checksums; returns,
/// per run and block, the checksum failure if it has one.
fn load_runs(
    shared: &DiskShared,
    fork: &Arc<Fork>,
    runs: &[Run<DiskOp>],
) -> Result<Vec<Vec<Option<SlotFailure>>>, SlotFailure> {
    let last = runs.last().expect("a run");
    let last_block = last.first.block + last.blocks.len() as u64 - 1;
    let action =
        || format!("read blocks {}..={last_block} of {fork} ({} runs)", runs[0].first.block, runs.len());
    let backend = fork.backend().map_err(|error| failure_from(action(), &error))?;
    let mut guards: Vec<Vec<_>> = runs
        .iter()
        .map(|run| run.blocks.iter().map(|ops| shared.pool.write(ops[0].slot)).collect())
        .collect();
    let mut pieces: Vec<(u64, Vec<&mut [u8]>)> = runs
        .iter()
        .zip(guards.iter_mut())
        .map(|(run, guards)| {
            (block_offset(shared, run.first.block), guards.iter_mut().map(|guard| &mut guard[..]).collect())
        })
        .collect();
    let below_end = backend.read_gathered(&mut pieces).map_err(|error| SlotFailure::new(action(), &error))?;
    drop(pieces);
    bump(&shared.counters.disk_reads, 1);
    let mut verdicts = Vec::with_capacity(runs.len());
    for ((run, guards), bytes) in runs.iter().zip(&guards).zip(below_end) {
        bump(&shared.counters.disk_read_blocks, run.blocks.len() as u64);
        bump(&shared.counters.disk_read_bytes, bytes as u64);
        let slices: Vec<&[u8]> = guards.iter().map(|guard| &guard[..]).collect();
        let span = ReadSpan { offset: block_offset(shared, run.first.block), below_end_bytes: bytes as u64 };
        verdicts.push(verify_blocks(shared, fork, backend.as_ref(), span, &slices)?);
    }
    Ok(verdicts)
}

/// Where a run was read and how much of it lay below the end of the fork on disk.
#[derive(Clone, Copy, Debug)]
struct ReadSpan {
    offset: u64,
    below_end_bytes: u64,
}

/// Checks each checksum block of `blocks` (cache blocks read from `span.offset`) that lies
/// below the end of the fork; past the end, bytes are zeros the medium never held.
fn verify_blocks(
    shared: &DiskShared,
    fork: &Fork,
    backend: &dyn ForkBackend,
    span: ReadSpan,
    blocks: &[&[u8]],
) -> Result<Vec<Option<SlotFailure>>, SlotFailure> {
    let checksum_bytes = fork.target().checksum_block_bytes() as usize;
    let per_block = shared.pool.block_bytes() / checksum_bytes;
    let mut entries = vec![0u32; blocks.len() * per_block];
    let first_entry = span.offset / checksum_bytes as u64;
    backend
        .read_checksums(first_entry, &mut entries)
        .map_err(|error| SlotFailure::new(format!("read checksums of {fork}"), &error))?;
    let end = span.offset + span.below_end_bytes;
    let mut verdicts = Vec::with_capacity(blocks.len());
    for (index, block) in blocks.iter().enumerate() {
        let mut verdict = None;
        for (within, chunk) in block.chunks(checksum_bytes).enumerate() {
            let entry = index * per_block + within;
            let at = span.offset + (entry * checksum_bytes) as u64;
            if at >= end {
                break;
            }
            if let Err(computed) = checksum::block_matches(chunk, entries[entry]) {
                bump(&shared.counters.checksum_errors, 1);
                let mismatch = fork.mismatch(at, checksum_bytes as u64, entries[entry], computed);
                tracing::error!(error = %mismatch.to_error(), "fork data failed its checksum");
                verdict = Some(SlotFailure::checksum(mismatch));
                break;
            }
        }
        verdicts.push(verdict);
    }
    Ok(verdicts)
}

fn write_run(shared: &DiskShared, run: Run<DiskOp>) {
    let fork = run.blocks[0][0].fork.clone();
    let result = write_blocks(shared, &fork, &run);
    for op in run.blocks.into_iter().flatten() {
        op.fork.writeback_finished();
        if let DiskOpKind::Write(ticket) = op.kind {
            ticket.complete(result.as_ref().map(|_| ()).map_err(SlotFailure::to_error));
        }
    }
}

/// Writes the run's slots back, each cut at the fork's logical size.
fn write_blocks(shared: &DiskShared, fork: &Arc<Fork>, run: &Run<DiskOp>) -> Result<(), SlotFailure> {
    let last_block = run.first.block + run.blocks.len() as u64 - 1;
    let action = || format!("write blocks {}..={last_block} of {fork}", run.first.block);
    let backend = fork.backend().map_err(|error| failure_from(action(), &error))?;
    let size_bytes = fork.size_bytes();
    let block_bytes = shared.pool.block_bytes() as u64;
    let guards: Vec<_> = run.blocks.iter().map(|ops| shared.pool.read(ops[0].slot)).collect();
    let mut buffers: Vec<&[u8]> = Vec::with_capacity(guards.len());
    for (index, guard) in guards.iter().enumerate() {
        let start = block_offset(shared, run.first.block + index as u64);
        if start >= size_bytes {
            break;
        }
        let length = block_bytes.min(size_bytes - start) as usize;
        buffers.push(&guard[..length]);
    }
    if buffers.is_empty() {
        return Ok(());
    }
    let bytes: usize = buffers.iter().map(|buffer| buffer.len()).sum();
    let offset = block_offset(shared, run.first.block);
    let checksum_bytes = fork.target().checksum_block_bytes() as usize;
    let mut entries = Vec::with_capacity(bytes.div_ceil(checksum_bytes));
    for buffer in &buffers {
        checksum::crcs_of(buffer, checksum_bytes, &mut entries);
    }
    backend.write_at(offset, &buffers).map_err(|error| SlotFailure::new(action(), &error))?;
    fork.mark_unsynced();
    backend
        .write_checksums(offset / checksum_bytes as u64, &entries)
        .map_err(|error| SlotFailure::new(format!("write checksums of {fork}"), &error))?;
    bump(&shared.counters.disk_writes, 1);
    bump(&shared.counters.disk_write_blocks, buffers.len() as u64);
    bump(&shared.counters.disk_write_bytes, bytes as u64);
    Ok(())
}

fn failure_from(action: String, error: &StoreError) -> SlotFailure {
    SlotFailure {
        action,
        kind: error.io_kind().unwrap_or(io::ErrorKind::Other),
        message: error.to_string(),
        mismatch: None,
    }
}
