//! The cache's block memory: a fixed array of slots, each holding one block's bytes, a
//! readiness state and (after a failed read) the failure.
//!
//! Why separate from `BlockCache`: the disk scheduler threads need the bytes and the
//! readiness of a slot but never the cache's index, so they hold only this pool.
//!
//! Invariants:
//! - Slot memory is allocated on first use and then reused for the life of the pool, so a
//!   hot path never touches freshly allocated pages.
//! - A slot is `LOADING` from the moment the cache assigns it a block until its bytes are
//!   valid (`READY`) or the read failed (`FAILED`); nobody but its loader touches the bytes
//!   of a `LOADING` slot.
//! - Readiness only moves forward (`LOADING` -> `READY`/`FAILED`) until the cache reassigns
//!   the slot, which it does only when nobody holds it.

use crate::error::{Mismatch, StoreError};
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

const LOADING: u8 = 0;
const READY: u8 = 1;
const FAILED: u8 = 2;

/// Why a slot could not be loaded; turned into a `StoreError` for every waiter.
#[derive(Clone, Debug)]
pub(crate) struct SlotFailure {
    pub action: String,
    pub kind: io::ErrorKind,
    pub message: String,
    /// Set when the block was read but failed its checksum.
    pub mismatch: Option<Box<Mismatch>>,
}

impl SlotFailure {
    pub(crate) fn new(action: String, error: &io::Error) -> Self {
        Self { action, kind: error.kind(), message: error.to_string(), mismatch: None }
    }

    /// A block whose bytes did not match their stored checksum.
    pub(crate) fn checksum(mismatch: Mismatch) -> Self {
        Self {
            action: String::new(),
            kind: io::ErrorKind::InvalidData,
            message: String::new(),
            mismatch: Some(Box::new(mismatch)),
        }
    }

    pub(crate) fn to_error(&self) -> StoreError {
        if let Some(mismatch) = &self.mismatch {
            return mismatch.to_error();
        }
        StoreError::io(self.action.clone(), io::Error::new(self.kind, self.message.clone()))
    }
}

#[derive(Debug)]
struct Slot {
    bytes: RwLock<Vec<u8>>,
    state: AtomicU8,
    failure: Mutex<Option<SlotFailure>>,
}

/// Block memory shared by the cache and the disk schedulers.
#[derive(Debug)]
pub(crate) struct SlotPool {
    slots: Box<[Slot]>,
    block_bytes: usize,
    ready_lock: Mutex<()>,
    ready: Condvar,
}

impl SlotPool {
    pub(crate) fn new(count: usize, block_bytes: usize) -> Self {
        assert!(block_bytes.is_power_of_two());
        let slots = (0..count)
            .map(|_| Slot {
                bytes: RwLock::new(Vec::new()),
                state: AtomicU8::new(READY),
                failure: Mutex::new(None),
            })
            .collect();
        Self { slots, block_bytes, ready_lock: Mutex::new(()), ready: Condvar::new() }
    }

    pub(crate) fn count(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Shared access to a ready slot's bytes.
    pub(crate) fn read(&self, slot: u32) -> RwLockReadGuard<'_, Vec<u8>> {
        let guard = self.slots[slot as usize].bytes.read();
        debug_assert_eq!(guard.len(), self.block_bytes, "reading an unallocated slot");
        guard
    }

    /// Exclusive access to a slot's bytes, allocating them on first use.
    pub(crate) fn write(&self, slot: u32) -> RwLockWriteGuard<'_, Vec<u8>> {
        let mut guard = self.slots[slot as usize].bytes.write();
        if guard.len() != self.block_bytes {
            *guard = vec![0; self.block_bytes];
        }
        guard
    }

    /// Marks a slot as being loaded (called by the cache when it assigns a block).
    pub(crate) fn begin_loading(&self, slot: u32) {
        self.slots[slot as usize].state.store(LOADING, Ordering::Release);
    }

    /// Zero-fills a loading slot and marks it ready.
    pub(crate) fn zero_fill(&self, slot: u32) {
        self.write(slot).fill(0);
        self.mark_ready(slot);
    }

    pub(crate) fn mark_ready(&self, slot: u32) {
        self.slots[slot as usize].state.store(READY, Ordering::Release);
        self.wake_waiters();
    }

    pub(crate) fn mark_failed(&self, slot: u32, failure: SlotFailure) {
        let entry = &self.slots[slot as usize];
        *entry.failure.lock() = Some(failure);
        entry.state.store(FAILED, Ordering::Release);
        self.wake_waiters();
    }

    pub(crate) fn is_failed(&self, slot: u32) -> bool {
        self.slots[slot as usize].state.load(Ordering::Acquire) == FAILED
    }

    /// Blocks until the slot is ready; returns its failure if the load failed.
    pub(crate) fn wait_ready(&self, slot: u32) -> Result<(), StoreError> {
        let entry = &self.slots[slot as usize];
        if entry.state.load(Ordering::Acquire) == READY {
            return Ok(());
        }
        let mut guard = self.ready_lock.lock();
        loop {
            match entry.state.load(Ordering::Acquire) {
                READY => return Ok(()),
                FAILED => return Err(self.failure_of(slot)),
                _ => self.ready.wait(&mut guard),
            }
        }
    }

    fn failure_of(&self, slot: u32) -> StoreError {
        match &*self.slots[slot as usize].failure.lock() {
            Some(failure) => failure.to_error(),
            None => StoreError::io(
                format!("load cache slot {slot}"),
                io::Error::other("failed without a recorded cause"),
            ),
        }
    }

    /// Taking the lock orders this wake-up after any waiter's check of the state.
    fn wake_waiters(&self) {
        let _guard = self.ready_lock.lock();
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waiter_sees_ready_and_failure() {
        let pool = Arc::new(SlotPool::new(2, 512));
        pool.begin_loading(0);
        pool.begin_loading(1);
        let waiter = {
            let pool = pool.clone();
            std::thread::spawn(move || (pool.wait_ready(0).is_ok(), pool.wait_ready(1).is_err()))
        };
        pool.zero_fill(0);
        let error = io::Error::new(io::ErrorKind::PermissionDenied, "no");
        pool.mark_failed(1, SlotFailure::new("read block 1".into(), &error));
        assert_eq!(waiter.join().unwrap(), (true, true));
        let failure = pool.wait_ready(1).unwrap_err();
        assert_eq!(failure.io_kind(), Some(io::ErrorKind::PermissionDenied));
        assert_eq!(pool.read(0).len(), 512);
    }
}
