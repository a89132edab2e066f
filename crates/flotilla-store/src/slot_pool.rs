//! The cache's block memory: a fixed array of slots, each holding one block's bytes, a
//! readiness state and (after a failed read) the failure.
//!
//! Why separate from `BlockCache`: the disk scheduler threads need the bytes and the
//! readiness of a slot but never the cache's index, so they hold only this pool.
//!
//! Invariants:
//! - Slot memory is one mapping (`Arena`, in transparent huge pages where the kernel has
//!   them), slot `i` at `i × block_bytes`; the kernel gives its pages on first touch and
//!   the pool reuses them for its whole life, so a hot path never touches fresh pages.
//! - A slot's bytes are read only under its lock's shared side and written only under its
//!   exclusive side (`SlotRead`, `SlotWrite`): the lock is what makes handing out slices
//!   of the shared mapping sound.
//! - A slot is `LOADING` from the moment the cache assigns it a block until its bytes are
//!   valid (`READY`) or the read failed (`FAILED`); nobody but its loader touches the bytes
//!   of a `LOADING` slot.
//! - Readiness only moves forward (`LOADING` -> `READY`/`FAILED`) until the cache reassigns
//!   the slot, which it does only when nobody holds it.
//! - Waiters are woken per slot: a thread waiting for a slot parks on that slot's address
//!   (`parking_lot_core`), and a slot that becomes ready or failed wakes only its own
//!   waiters, not every thread waiting for any block.

use crate::arena::Arena;
use crate::error::{Mismatch, StoreError};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use parking_lot_core::{DEFAULT_PARK_TOKEN, DEFAULT_UNPARK_TOKEN};
use std::io;
use std::ops::{Deref, DerefMut};
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
    /// Guards the slot's range of the arena.
    bytes: RwLock<()>,
    state: AtomicU8,
    failure: Mutex<Option<SlotFailure>>,
}

/// Block memory shared by the cache and the disk schedulers.
#[derive(Debug)]
pub(crate) struct SlotPool {
    slots: Box<[Slot]>,
    block_bytes: usize,
    memory: Arena,
}

/// Shared access to one slot's bytes; the slot's lock is held while it lives.
pub(crate) struct SlotRead<'a> {
    _lock: RwLockReadGuard<'a, ()>,
    bytes: &'a [u8],
}

impl Deref for SlotRead<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

/// Exclusive access to one slot's bytes; the slot's lock is held while it lives.
pub(crate) struct SlotWrite<'a> {
    _lock: RwLockWriteGuard<'a, ()>,
    bytes: &'a mut [u8],
}

impl Deref for SlotWrite<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl DerefMut for SlotWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

impl SlotPool {
    /// `count` slots of `block_bytes` each, in one mapping (in huge pages if `huge_pages`
    /// and the kernel has them).
    pub(crate) fn new(count: usize, block_bytes: usize, huge_pages: bool) -> io::Result<Self> {
        assert!(block_bytes.is_power_of_two());
        let bytes = count.checked_mul(block_bytes).ok_or_else(|| io::Error::other("cache size overflows"))?;
        let memory = Arena::new(bytes, huge_pages)?;
        let slots = (0..count)
            .map(|_| Slot { bytes: RwLock::new(()), state: AtomicU8::new(READY), failure: Mutex::new(None) })
            .collect();
        Ok(Self { slots, block_bytes, memory })
    }

    pub(crate) fn count(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Shared access to a ready slot's bytes.
    pub(crate) fn read(&self, slot: u32) -> SlotRead<'_> {
        let lock = self.slots[slot as usize].bytes.read();
        // SAFETY: the slot's range, read under its lock's shared side: no `SlotWrite` of it
        // exists while this does, and no other slot's guard covers it.
        let bytes = unsafe { self.memory.slice(slot as usize * self.block_bytes, self.block_bytes) };
        SlotRead { _lock: lock, bytes }
    }

    /// Exclusive access to a slot's bytes (zeros until first written).
    pub(crate) fn write(&self, slot: u32) -> SlotWrite<'_> {
        let lock = self.slots[slot as usize].bytes.write();
        // SAFETY: the slot's range, under its lock's exclusive side: no other guard of it
        // exists while this does, and no other slot's guard covers it.
        let bytes = unsafe { self.memory.slice_mut(slot as usize * self.block_bytes, self.block_bytes) };
        SlotWrite { _lock: lock, bytes }
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
        self.wake_waiters(slot);
    }

    pub(crate) fn mark_failed(&self, slot: u32, failure: SlotFailure) {
        let entry = &self.slots[slot as usize];
        *entry.failure.lock() = Some(failure);
        entry.state.store(FAILED, Ordering::Release);
        self.wake_waiters(slot);
    }

    pub(crate) fn is_failed(&self, slot: u32) -> bool {
        self.slots[slot as usize].state.load(Ordering::Acquire) == FAILED
    }

    /// Blocks until the slot is ready; returns its failure if the load failed.
    pub(crate) fn wait_ready(&self, slot: u32) -> Result<(), StoreError> {
        let entry = &self.slots[slot as usize];
        loop {
            match entry.state.load(Ordering::Acquire) {
                READY => return Ok(()),
                FAILED => return Err(self.failure_of(slot)),
                _ => self.park_on(entry),
            }
        }
    }

    /// Sleeps until the slot's loader wakes its waiters; returns at once if the slot is no
    /// longer loading when the park is checked.
    fn park_on(&self, entry: &Slot) {
        let key = park_key(entry);
        let still_loading = || entry.state.load(Ordering::Acquire) == LOADING;
        // SAFETY: the key is the address of a slot this pool owns for its whole life; the
        // validate closure only reads an atomic and the other callbacks do nothing, so none
        // of them can panic or call into parking_lot while its bucket lock is held.
        unsafe {
            parking_lot_core::park(key, still_loading, || {}, |_, _| {}, DEFAULT_PARK_TOKEN, None);
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

    /// Wakes the threads parked on this slot. The state was stored before, and `park`
    /// checks it under the same bucket lock `unpark_all` takes, so no waiter misses it.
    fn wake_waiters(&self, slot: u32) {
        let key = park_key(&self.slots[slot as usize]);
        // SAFETY: unparking by the address of a slot this pool owns; no callbacks.
        unsafe {
            parking_lot_core::unpark_all(key, DEFAULT_UNPARK_TOKEN);
        }
    }
}

/// The address waiters of a slot park on.
fn park_key(entry: &Slot) -> usize {
    &entry.state as *const AtomicU8 as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waiter_sees_ready_and_failure() {
        let pool = Arc::new(SlotPool::new(2, 512, false).unwrap());
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

    /// Many threads wait on many slots at once; each slot is finished (ready or failed) in
    /// a scrambled order by loader threads, and every waiter must return with its own
    /// slot's outcome: no wake-up lost, none taken for another slot's.
    #[test]
    fn per_slot_waiters_each_see_their_own_slot() {
        const SLOTS: u32 = 16;
        const WAITERS_PER_SLOT: u32 = 3;
        let pool = Arc::new(SlotPool::new(SLOTS as usize, 512, true).unwrap());
        for round in 0..20u32 {
            (0..SLOTS).for_each(|slot| pool.begin_loading(slot));
            let waiters: Vec<_> = (0..SLOTS * WAITERS_PER_SLOT)
                .map(|i| {
                    let pool = pool.clone();
                    let slot = i % SLOTS;
                    std::thread::spawn(move || (slot, pool.wait_ready(slot).is_ok()))
                })
                .collect();
            let order: Vec<u32> = (0..SLOTS).map(|i| (i * 7 + round) % SLOTS).collect();
            let loaders: Vec<_> = order
                .chunks(4)
                .map(|chunk| {
                    let (pool, chunk) = (pool.clone(), chunk.to_vec());
                    std::thread::spawn(move || {
                        for slot in chunk {
                            if (slot + round) % 3 == 0 {
                                let error = io::Error::other("bad sector");
                                pool.mark_failed(slot, SlotFailure::new(format!("read {slot}"), &error));
                            } else {
                                pool.zero_fill(slot);
                            }
                        }
                    })
                })
                .collect();
            loaders.into_iter().for_each(|loader| loader.join().unwrap());
            for waiter in waiters {
                let (slot, ok) = waiter.join().unwrap();
                assert_eq!(ok, (slot + round) % 3 != 0, "slot {slot} in round {round}");
            }
        }
    }
}
